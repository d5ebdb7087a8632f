package containerdenv

import "errors"

// ErrUnknownVersion: a containerd version this package cannot run (see
// Versions and VersionEnv).
var ErrUnknownVersion = errors.New("unknown containerd version")
