package cri

import "errors"

// ErrNotFound reports that the container runtime does not know the sandbox
// (gRPC status NotFound). Callers check it with errors.Is; it is the only
// evidence that a sandbox is gone — any other error means "unknown" and must
// not be taken as absence.
var ErrNotFound = errors.New("sandbox not found")
