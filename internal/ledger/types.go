package ledger

import (
	"fmt"
	"net/netip"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ipledger/ipledger/internal/attachment"
	"github.com/ipledger/ipledger/internal/pool"
)

// Reason says why a lease was released. Every release records one.
type Reason string

// The release reasons.
const (
	ReasonDEL               Reason = "DEL"
	ReasonGC                Reason = "GC"
	ReasonReconcileGone     Reason = "reconcile-gone"
	ReasonReconcileNotReady Reason = "reconcile-notready"
	ReasonSuperseded        Reason = "superseded"
	ReasonManual            Reason = "manual"
)

// Valid reports whether r is one of the release reasons.
func (r Reason) Valid() bool {
	switch r {
	case ReasonDEL, ReasonGC, ReasonReconcileGone, ReasonReconcileNotReady, ReasonSuperseded, ReasonManual:
		return true
	}
	return false
}

// Limits on the fields of a request; longer ones are refused, not truncated. Together
// they keep every record the ledger writes well under the store's record limit
// (64 KiB), so that no field can make a commit fail (and with it the other requests
// of its group commit).
const (
	MaxNetworkLen     = attachment.MaxNetworkLen
	MaxContainerIDLen = attachment.MaxContainerIDLen
	MaxIfNameLen      = attachment.MaxIfNameLen
	// Pod fields: Kubernetes allows 63 bytes of namespace (a DNS label) and 253 of
	// pod name (a DNS subdomain); a UID is 36; these leave room for other runtimes.
	MaxPodNamespaceLen = 253
	MaxPodNameLen      = 253
	MaxPodUIDLen       = 128
	// MaxNetNSPathLen is PATH_MAX.
	MaxNetNSPathLen = 4096
	// MaxDetailLen bounds a release's detail (an operator's reason, a reconciler's
	// evidence).
	MaxDetailLen = 4096
	// MaxWhyLen bounds a lease's Why.
	MaxWhyLen = 512
	// MaxExclude bounds AllocateRequest.Exclude.
	MaxExclude = 256
)

// Key identifies a CNI attachment: network name, container ID, interface name.
type Key struct {
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
}

func (k Key) String() string { return k.Network + "/" + k.ContainerID + "/" + k.IfName }

// Validate checks the key against the CNI spec's rules and our length limits
// (attachment.ValidateKey); the error wraps ErrInvalidAttachment.
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

// Validate checks the pod fields against their limits.
func (p Pod) Validate() error {
	for _, f := range []struct {
		name, v string
		max     int
	}{
		{"K8S_POD_NAMESPACE", p.Namespace, MaxPodNamespaceLen},
		{"K8S_POD_NAME", p.Name, MaxPodNameLen},
		{"K8S_POD_UID", p.UID, MaxPodUIDLen},
		{"K8S_POD_INFRA_CONTAINER_ID", p.InfraContainerID, MaxContainerIDLen},
	} {
		if err := boundedText(f.name, f.v, f.max); err != nil {
			return err
		}
	}
	return nil
}

// boundedText refuses a free-text field longer than max bytes or holding a NUL or
// invalid UTF-8.
func boundedText(field, v string, max int) error {
	if len(v) > max {
		return fmt.Errorf("%w: %s: %d bytes; at most %d", ErrInvalidAttachment, field, len(v), max)
	}
	if !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
		return fmt.Errorf("%w: %s: holds a NUL byte or invalid UTF-8", ErrInvalidAttachment, field)
	}
	return nil
}

// validRelease checks a release's reason and detail.
func validRelease(reason Reason, detail string) error {
	if !reason.Valid() {
		return fmt.Errorf("release reason %q is not one of DEL, GC, reconcile-gone, reconcile-notready, superseded, manual", reason)
	}
	if err := boundedText("release detail", detail, MaxDetailLen); err != nil {
		return fmt.Errorf("%w (shorten the reason text)", err)
	}
	return nil
}

// NetNS is the network namespace given at ADD: its path and, when the path could be
// read, its identity (device and inode of the nsfs file).
type NetNS struct {
	Path string `json:"path,omitempty"`
	Dev  uint64 `json:"dev,omitempty"`
	Ino  uint64 `json:"ino,omitempty"`
}

// Validate checks the namespace path against its limit.
func (n NetNS) Validate() error { return boundedText("CNI_NETNS", n.Path, MaxNetNSPathLen) }

// Lease is one attachment's hold on its addresses.
type Lease struct {
	Key     Key            `json:"key"`
	Pod     Pod            `json:"pod"`
	NetNS   NetNS          `json:"netns"`
	IPs     []netip.Prefix `json:"ips"` // one per range set, with the subnet's prefix length
	Created time.Time      `json:"created"`
	State   string         `json:"state"`
	// Why says why the lease got its addresses (AllocateRequest.Why): "default pool",
	// "requested by ipledger.io/ip", "sticky for web-0 (StatefulSet default/web)",
	// "sticky for web-0, borrowed from node node2". Empty for a lease written before
	// it existed.
	Why string `json:"why,omitempty"`
	// Borrowed are the lease's addresses lent to this node from another node's
	// block (a StatefulSet pod's sticky address; the block record in the cluster
	// datastore says so): held here outside the node's blocks, and not kept free
	// here when released (the lender's block keeps them for the pod).
	Borrowed []netip.Addr `json:"borrowed,omitempty"`
	// Pool is the ledger pool the addresses came from when it is not the
	// attachment's network's own (AllocateRequest.Pool: a named pool of cluster
	// mode); empty for the network's own pool.
	Pool string `json:"pool,omitempty"`
	// BootID and SinceBoot are the machine's boot and its CLOCK_BOOTTIME reading at
	// the allocation, when known (Options.Boot), stored in the allocation's own
	// transaction. Unlike Created (a wall time) they measure the lease's age: a
	// process on the same boot, such as the reconciler after an agent restart,
	// counts it from the allocation rather than from its own first sight. Records
	// written without them read as unknown.
	BootID    string        `json:"bootID,omitempty"`
	SinceBoot time.Duration `json:"sinceBoot,omitempty"`
}

// PoolNetwork is the name of the ledger pool that holds the lease's addresses:
// Pool, else the attachment's network.
func (ls Lease) PoolNetwork() string {
	if ls.Pool != "" {
		return ls.Pool
	}
	return ls.Key.Network
}

// Lease states.
const (
	StateActive = "active"
)

// Release is one entry of an address's history: who held it, from when to when, and
// why it was released.
type Release struct {
	Network string     `json:"network"`
	IP      netip.Addr `json:"ip"`
	Key     Key        `json:"key"`
	Pod     Pod        `json:"pod"`
	From    time.Time  `json:"from"`
	To      time.Time  `json:"to"`
	Reason  Reason     `json:"reason"`
	Detail  string     `json:"detail,omitempty"`
	// Why is the released lease's Why: why it had the address (a sticky address,
	// borrowed from a node).
	Why string `json:"why,omitempty"`
	Seq uint64 `json:"seq"`
}

// Free is a released address waiting to be reused, in release order.
type Free struct {
	Network    string     `json:"network"`
	IP         netip.Addr `json:"ip"`
	Set        int        `json:"set"`
	ReleasedAt time.Time  `json:"releasedAt"`
	Seq        uint64     `json:"seq"`
	LastUID    string     `json:"lastUID,omitempty"`
	// BootID and SinceBoot are the machine's boot and its CLOCK_BOOTTIME reading at
	// the release, when known (Options.Boot): a restart on the same boot counts the
	// reuse delay from the release, not from its start.
	BootID    string        `json:"bootID,omitempty"`
	SinceBoot time.Duration `json:"sinceBoot,omitempty"`
}

// PoolRecord is the durable description of a network's pool.
type PoolRecord struct {
	Network     string          `json:"network"`
	Ranges      []pool.RangeSet `json:"ranges"`
	Created     time.Time       `json:"created"`
	NextFresh   []uint64        `json:"nextFresh"` // per range set: offsets below it have been handed out at least once
	Seq         uint64          `json:"seq"`       // release sequence
	Allocations uint64          `json:"allocations"`
	Releases    uint64          `json:"releases"` // addresses, not leases
	// BlockBits makes the pool cluster-scoped: its ranges are cluster-wide and this
	// node allocates only inside the blocks it owns (see BlockRecord), blocks of
	// BlockBits[i] prefix length in range set i. Nil for a node-mode pool (the whole
	// of its ranges is this node's, NextFresh counts through them).
	BlockBits []int `json:"blockBits,omitempty"`
	// Retired are the range sets a node-mode pool had before its ranges were
	// replaced (AllocateRequest.ReplaceRanges) that still hold live leases: nothing
	// is allocated from them, a release there is recorded in the history but the
	// address is not kept free (it is no longer this pool's to hand out), and a
	// retired set goes with its last lease. Disjoint from Ranges.
	Retired []pool.RangeSet `json:"retired,omitempty"`
	// RangeChanges counts the replacements of Ranges. Leases made before one may
	// hold fewer or more addresses than the pool now has range sets.
	RangeChanges uint64 `json:"rangeChanges,omitempty"`
	// Replaced records the last time the pool, holding no live lease, was replaced
	// by a config with other ranges or another shape (node mode <-> cluster mode);
	// nil if it never was. The counters and the history carry over.
	Replaced *PoolReplacement `json:"replaced,omitempty"`
}

// PoolReplacement is what a pool was before its last replacement and why.
type PoolReplacement struct {
	At            time.Time       `json:"at"`
	FromRanges    []pool.RangeSet `json:"fromRanges"`
	FromBlockBits []int           `json:"fromBlockBits,omitempty"`
	Reason        string          `json:"reason"`
}

// BlockState says whether a block's addresses may be handed out.
type BlockState string

// The block states.
const (
	// BlockActive: the node owns the block and can prove it; its addresses are
	// handed out.
	BlockActive BlockState = "active"
	// BlockSuspended: the node cannot prove it still owns the block (its node lease
	// may have expired); nothing is handed out from it, releases are recorded and its
	// free addresses wait for ResumeBlock.
	BlockSuspended BlockState = "suspended"
	// BlockLost: another node owns the block now. Nothing is handed out from it; the
	// leases still in it are released locally only (their addresses are not kept as
	// free here), and the block record goes with its last lease.
	BlockLost BlockState = "lost"
	// BlockDraining: the block's range left the pool (an operator removed it): the
	// node still owns it, hands nothing more out from it, and keeps no released
	// address of it free; its live leases keep their addresses, and the block
	// manager gives it back once it holds none (RemoveBlock).
	BlockDraining BlockState = "draining"
)

// Valid reports whether s is one of the block states.
func (s BlockState) Valid() bool {
	return s == BlockActive || s == BlockSuspended || s == BlockLost || s == BlockDraining
}

// BlockRecord is one block of a cluster-scoped pool as this node holds it.
type BlockRecord struct {
	Network string       `json:"network"`
	Prefix  netip.Prefix `json:"prefix"`
	Set     int          `json:"set"`   // the range set the block belongs to
	Epoch   uint64       `json:"epoch"` // the datastore epoch the node claimed it at
	State   BlockState   `json:"state"`
	// NextFresh counts the block's addresses (offsets of the range set clipped to the
	// block) handed out at least once since the block was added: those at offsets
	// below it are held or free, those above have never been used here. It is stored
	// with the block's other changes only; the ledger raises it past every held or
	// free address of the block when it loads.
	NextFresh uint64    `json:"nextFresh"`
	Added     time.Time `json:"added"`
}

// Store persists the ledger. It is owned by the ledger; implementations live in
// internal/store.
//
// Contract: Update runs fn in one transaction; when fn returns nil the transaction is
// committed and durable (fsync'd) before Update returns nil; when fn or the commit
// fails, nothing of it is stored and the error is returned (wrapping ErrStore for I/O
// failures). View runs fn against a consistent read-only snapshot. Keys are compared
// exactly; iteration order is by key. Implementations are safe for concurrent use.
type Store interface {
	Update(fn func(Tx) error) error
	View(fn func(ReadTx) error) error
	Close() error
}

// ReadTx reads the stored ledger.
type ReadTx interface {
	Pool(network string) (PoolRecord, bool, error)
	ForEachPool(fn func(PoolRecord) error) error
	Lease(k Key) (Lease, bool, error)
	ForEachLease(fn func(Lease) error) error
	ForEachFree(fn func(Free) error) error
	// History returns the releases of ip in network, oldest first.
	History(network string, ip netip.Addr) ([]Release, error)
	// ForEachHistory visits every release, grouped by network and address, oldest first.
	ForEachHistory(fn func(Release) error) error
	// ForEachBlock visits the blocks of cluster-scoped pools, by network and address.
	ForEachBlock(fn func(BlockRecord) error) error
}

// Tx changes the stored ledger inside Update.
type Tx interface {
	ReadTx
	PutPool(PoolRecord) error
	PutLease(Lease) error
	DeleteLease(Key) error
	PutFree(Free) error
	DeleteFree(network string, ip netip.Addr) error
	// AppendHistory adds r and drops the oldest entries of its address beyond keep.
	AppendHistory(r Release, keep int) error
	PutBlock(BlockRecord) error
	DeleteBlock(network string, prefix netip.Prefix) error
}
