package veth

import "errors"

// Sentinel errors of the veth plugin. They are wrapped with %w where they
// occur and mapped to CNI error codes only at the plugin boundary (toCNIError).
var (
	// ErrConfig reports an invalid network configuration (bad mtu, prefix, name...).
	ErrConfig = errors.New("invalid network configuration")

	// ErrNotNetNS reports a CNI_NETNS that cannot be opened or is not a network namespace.
	ErrNotNetNS = errors.New("not a network namespace")

	// ErrHostNetNS reports a CNI_NETNS whose identity (dev:inode) is the plugin's own
	// network namespace or the host's (PID 1's): ADD and CHECK refuse to touch it.
	ErrHostNetNS = errors.New("CNI_NETNS is the host's or the plugin's own network namespace")

	// ErrNetNSMismatch reports a CNI_NETNS whose identity differs from the one
	// recorded at ADD; CHECK does not enter it.
	ErrNetNSMismatch = errors.New("CNI_NETNS is not the network namespace recorded at ADD")

	// ErrNotOurs reports an interface that has our deterministic name but is not an
	// ipledger-veth host-side veth of this attachment; it is never modified or deleted.
	ErrNotOurs = errors.New("interface is not an ipledger-veth attachment of this network")

	// ErrNoAttachment reports that the host-side veth of an attachment does not exist.
	ErrNoAttachment = errors.New("attachment not found")

	// ErrIPAMResult reports an IPAM result the plugin cannot use (no addresses...).
	ErrIPAMResult = errors.New("unusable IPAM result")

	// ErrCheckFailed reports a CHECK mismatch between prevResult and the interfaces.
	ErrCheckFailed = errors.New("attachment does not match prevResult")
)
