package api

import (
	"errors"
	"net/netip"
	"time"

	"github.com/ipledger/ipledger/internal/attachment"
	"github.com/ipledger/ipledger/internal/pool"
)

// The protocol's own shapes of what the ledger records: the agent maps the ledger's
// types to these (internal/ledgerview), so that the plugins do not link the ledger and
// a change to the ledger's types cannot change the wire, the DEL spool's entries or
// `ipledgerctl -o json|yaml`. Their JSON is that of the ledger types they show
// (wire_fields_test.go holds it).

// ErrInvalidAttachment: a key the plugin was given breaks the CNI spec's rules or the
// length limits. The message names the field and the limit.
var ErrInvalidAttachment = errors.New("invalid attachment")

// Key identifies a CNI attachment: network name, container ID, interface name.
type Key struct {
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
}

func (k Key) String() string { return k.Network + "/" + k.ContainerID + "/" + k.IfName }

// Validate checks the key against the CNI spec's rules and the length limits
// (attachment.ValidateKey): the ledger's rules, which the agent applies again, checked
// here by the plugin before it sends a key or names a spool file after it. The error
// wraps ErrInvalidAttachment.
func (k Key) Validate() error {
	return attachment.ValidateKey(ErrInvalidAttachment, k.Network, k.ContainerID, k.IfName)
}

// Pod is the Kubernetes pod an attachment belongs to, when the runtime says.
type Pod struct {
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	UID       string `json:"uid,omitempty"`
	// InfraContainerID is K8S_POD_INFRA_CONTAINER_ID: the sandbox the runtime says
	// the attachment is for (with containerd and CRI-O, CNI_CONTAINERID itself).
	InfraContainerID string `json:"infraContainerID,omitempty"`
}

// NetNS is a network namespace: its path and, when the path could be read, its
// identity (device and inode of the nsfs file).
type NetNS struct {
	Path string `json:"path,omitempty"`
	Dev  uint64 `json:"dev,omitempty"`
	Ino  uint64 `json:"ino,omitempty"`
}

// NetNSFunc reads the identity of the network namespace at path (CNI_NETNS, or the
// caller's own), zero but the path when it cannot be read. ipam.NetNSID reads the
// nsfs file; the agent, running a forwarded call, answers with the identities the
// call carried.
type NetNSFunc func(path string) NetNS

// Release is one entry of an address's history: who held it, from when to when, and
// why it was released (one of the ledger's reasons: DEL, GC, reconcile-gone,
// reconcile-notready, superseded, manual).
type Release struct {
	Network string     `json:"network"`
	IP      netip.Addr `json:"ip"`
	Key     Key        `json:"key"`
	Pod     Pod        `json:"pod"`
	From    time.Time  `json:"from"`
	To      time.Time  `json:"to"`
	Reason  string     `json:"reason"`
	Detail  string     `json:"detail,omitempty"`
	// Why is why the lease had the address (ledger.Lease.Why), when it was a choice.
	Why string `json:"why,omitempty"`
	Seq uint64 `json:"seq"`
}

// PoolStatus describes a network's pool.
type PoolStatus struct {
	Network   string          `json:"network"`
	Ranges    []pool.RangeSet `json:"ranges"`
	Usable    []uint64        `json:"usable"`    // per range set, gateways excluded
	InUse     int             `json:"inUse"`     // addresses held
	Free      int             `json:"free"`      // released addresses
	Available bool            `json:"available"` // an ADD could be served now
	Allocs    uint64          `json:"allocations"`
	Releases  uint64          `json:"releases"`
	// Retired: range sets the pool's ranges no longer include (the node's podCIDR
	// changed) that live leases still hold addresses in, each with how many.
	Retired []RetiredSet `json:"retired,omitempty"`
	// Replaced: the pool's last replacement (it held no live lease and a config
	// with other ranges or the other mode took it over), or nil if it never was.
	Replaced *PoolReplacement `json:"replaced,omitempty"`
	// BlockBits: the block sizes of a cluster-scoped pool, nil in node mode.
	BlockBits []int `json:"blockBits,omitempty"`
}

// PoolReplacement is what a pool was before its last replacement and why.
type PoolReplacement struct {
	At            time.Time       `json:"at"`
	FromRanges    []pool.RangeSet `json:"fromRanges"`
	FromBlockBits []int           `json:"fromBlockBits,omitempty"`
	Reason        string          `json:"reason"`
}

// RetiredSet is a retired range set of a pool and its live leases.
type RetiredSet struct {
	Ranges pool.RangeSet `json:"ranges"`
	Leases int           `json:"leases"`
}

// DoubleAssigned is an address held by more than one live attachment.
type DoubleAssigned struct {
	Network string     `json:"network"`
	IP      netip.Addr `json:"ip"`
	Holders []Key      `json:"holders"`
}

// PoolAudit is the balance of one pool: Allocations = Releases + Live.
type PoolAudit struct {
	Network     string `json:"network"`
	Allocations uint64 `json:"allocations"`
	Releases    uint64 `json:"releases"`
	Live        uint64 `json:"live"`
	Free        uint64 `json:"free"`
	// Drained (cluster mode): the subnets of the pool's ranges that drain on this
	// node (taken out of the pool, or listed in spec.drained): no new address
	// comes from them.
	Drained []string `json:"drained,omitempty"`
	// Draining (cluster mode): this node's blocks of the pool that drain, each
	// with what still holds it; a block is given back once nothing has held it
	// for the reuse delay.
	Draining []DrainingBlock `json:"draining,omitempty"`
}

// DrainingBlock is a block of a node that drains (its range left the pool, and
// may be back in it since) and the leases that still hold addresses in it.
type DrainingBlock struct {
	Block  string `json:"block"`
	Leases int    `json:"leases"`
	// Pods are the holders: "namespace/name", or the container ID (12
	// characters) of a lease without a pod.
	Pods []string `json:"pods"`
	// RangeInPool: the block's range is back in the pool (re-added while the
	// block drained); the block still hands nothing out until it is given back.
	RangeInPool bool `json:"rangeInPool,omitempty"`
}
