package cniinstall

import "errors"

// ErrBadConflist is returned for a conflist that no runtime would load.
var ErrBadConflist = errors.New("cniinstall: bad conflist")

// ErrBadRecord is returned for a record of installed plugins (RecordPath) that
// cannot be read as one: Install stops, Uninstall removes only Options.Plugins
// and the conflist and keeps the record for the operator to look at.
var ErrBadRecord = errors.New("cniinstall: bad record of installed plugins")

// ErrRuntimeUnsupported: the node's runtime is a version that loads no
// cniVersion ipledger's conflist can have.
var ErrRuntimeUnsupported = errors.New("cniinstall: runtime not supported")

// ErrVersionRefused: the cniVersion asked for (flag or conflist) is one the
// node's runtime, or a plugin of the chain already on the node (its portmap),
// does not load; the network would never be ready.
var ErrVersionRefused = errors.New("cniinstall: cniVersion refused by the runtime")

// ErrBadVersion: Options.CNIVersion is none of auto, keep or Versions.
var ErrBadVersion = errors.New("cniinstall: bad cniVersion choice")

// ErrNotFound is returned by Uninstall when the conflist or a plugin it was asked to
// remove is not there (and no record says an earlier Uninstall removed it): the
// directories are not the host's CNI dirs, or ipledger was not installed there.
var ErrNotFound = errors.New("cniinstall: not found")
