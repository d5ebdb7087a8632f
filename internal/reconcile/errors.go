package reconcile

import "errors"

// ErrNotOwnInterface: a stranded lease's address is configured on an interface
// that is not the lease's own (another name than its CNI_IFNAME, the loopback, or
// not a veth), so reclaiming it could remove another plugin's interface. Nothing
// is removed; the lease is kept and reported.
var ErrNotOwnInterface = errors.New("the address is not on the lease's own veth")
