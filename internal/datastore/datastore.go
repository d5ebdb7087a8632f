// Package datastore is the shared store of cluster mode: the few operations ipledger
// needs from etcd or the Kubernetes API to share pools across nodes in address blocks.
//
// The model is etcd's: keys with values and a modification revision; creates, updates
// and deletes conditional on the revision the caller read (compare-and-swap); lists by
// prefix; watches from a revision; and a per-node lease that its owner keeps alive.
// Two implementations exist: etcdds (go.etcd.io/etcd/client/v3: transactions on
// ModRevision, etcd leases) and kubeds (client-go: one custom resource per record,
// compare-and-swap on resourceVersion, a coordination.k8s.io Lease per node). One
// conformance suite (datastoretest) runs against every implementation, against real
// servers.
//
// Keys are slash-separated paths below the store's own root, made of a kind and a
// name: "pools/<network>", "blocks/<network>/<block>". The kind decides where a
// record lives (an etcd key prefix, or a custom resource type); names are at most
// MaxName bytes of [a-z0-9.-] (Kubernetes object names), so the callers encode
// addresses (10-0-0-64-26, fd00--40-122) before they use them as names.
// Values are JSON objects of at most MaxValue bytes.
//
// Exactly (CheckKey, CheckPrefix, CheckValue and CheckNode say so in code, and every
// implementation calls them before it sends anything):
//   - kind: 1 to 63 bytes of [a-z0-9-], starting with a letter; "nodes" is reserved
//     for Leases.
//   - name: one or more segments separated by "/", each non-empty and of [a-z0-9.-];
//     the whole name (segments and separators) at most MaxName bytes.
//   - key: kind "/" name. A prefix (List, Watch): kind "/" followed by zero or more
//     whole segments each ending in "/" ("blocks/", "blocks/net1/"), so a prefix
//     never matches part of a segment ("blocks/net1/" excludes "blocks/net10/x").
//   - value: a JSON object of at most MaxValue bytes. A store may re-encode it
//     (whitespace, key order) but never changes its meaning.
//   - node (Leases): a name segment; holder: 1 to MaxName bytes of printable
//     ASCII; ttl: a whole number of seconds, at least one; addrs: at most MaxAddrs
//     valid unicast addresses, no zone.
package datastore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// Sentinel errors. Implementations wrap them with %w and the key; callers test with
// errors.Is.
var (
	// ErrNotFound: the key does not exist (Get, Update, Delete), or a lease is unknown
	// to the server (Renew: it expired or was revoked).
	ErrNotFound = errors.New("datastore: not found")
	// ErrExists: Create found the key already there.
	ErrExists = errors.New("datastore: already exists")
	// ErrConflict: the key's revision is no longer the one the caller gave (somebody
	// else changed or deleted it first). Re-read and decide again.
	ErrConflict = errors.New("datastore: revision conflict")
	// ErrUnavailable: the server could not be reached or did not answer in time. The
	// operation may or may not have been applied; a caller that must know re-reads.
	ErrUnavailable = errors.New("datastore: unavailable")
	// ErrCompacted: Watch was asked for a revision the server no longer keeps; list
	// again and watch from the list's revision.
	ErrCompacted = errors.New("datastore: revision compacted")
	// ErrInvalid: a key, value or TTL the store refuses (the message names it).
	ErrInvalid = errors.New("datastore: invalid argument")
)

// Limits on what callers store.
const (
	MaxName  = 253       // bytes of a key's name part (a Kubernetes object name)
	MaxValue = 64 * 1024 // bytes of a value
	MaxAddrs = 8         // addresses published with a node lease
)

// KV is a key's stored value at its last modification.
type KV struct {
	Key   string
	Value []byte
	// Revision is the revision of the key's last change (etcd's ModRevision; the
	// object's resourceVersion on Kubernetes, which is numeric there). It is what
	// Update and Delete compare against. Revisions of one key only increase.
	Revision int64
}

// EventType says what happened to a key.
type EventType int

// The event types.
const (
	Put     EventType = iota + 1 // created or updated; KV holds the new value
	Deleted                      // deleted; KV holds the key and the deletion's revision
)

// Event is one change seen by Watch.
type Event struct {
	Type EventType
	KV   KV
}

// Store is the datastore. Every method is safe for concurrent use and honours ctx.
//
// Contract (the conformance suite checks each point against real servers):
//   - Create stores value under key only if the key does not exist (ErrExists) and
//     returns its revision.
//   - Update and Delete succeed only if the key's current revision equals rev
//     (ErrConflict otherwise, ErrNotFound when the key is gone). Update returns the new
//     revision, which is always above rev, even when the value did not change (so
//     every successful write is told apart). Of two callers that read the same
//     revision, at most one succeeds.
//   - List returns every key under prefix in key order, and the store revision the
//     list was read at (at least every returned KV's Revision).
//   - Watch streams, in order, every change under prefix after revision from (List's
//     revision), without gaps or duplicates, until ctx ends; then the channel is
//     closed. If the stream breaks (server restart, compaction), the channel is closed
//     after an Event-less error reported by Err on the returned Watch; the caller lists
//     again.
//   - Keys, prefixes and values that break the rules in the package comment are
//     refused with ErrInvalid, before anything is sent; the message names the key.
//   - Watch's events have strictly increasing revisions (each operation changes one
//     key, so no two events share one). A Deleted event's KV has no Value. If from is
//     older than the server keeps, Watch fails with ErrCompacted: either at once or
//     as the returned Watch's Err after its channel closes (etcd reports it only on
//     the stream). A stream the implementation can resume by itself (etcd's client
//     reconnects and resumes from the last revision it delivered) need not break on
//     a server restart; it must still deliver every change, once.
//   - When ctx ends before the answer, the error wraps ctx.Err(); when that is a
//     deadline the server did not meet, it wraps ErrUnavailable as well. A write
//     whose ctx was done before the call is not applied.
//   - A returned error wraps one of the sentinels above when one applies.
type Store interface {
	Get(ctx context.Context, key string) (KV, error)
	Create(ctx context.Context, key string, value []byte) (rev int64, err error)
	Update(ctx context.Context, key string, value []byte, rev int64) (newRev int64, err error)
	Delete(ctx context.Context, key string, rev int64) error
	List(ctx context.Context, prefix string) (kvs []KV, rev int64, err error)
	Watch(ctx context.Context, prefix string, from int64) (Watch, error)

	// Leases: the node's proof of life. See Lease.
	Leases() Leases

	Close() error
}

// Watch is a running watch.
type Watch interface {
	// Events delivers the changes; it is closed when the watch ends.
	Events() <-chan Event
	// Err says why the watch ended once Events is closed: nil when its context ended,
	// else the cause (wrapping ErrCompacted or ErrUnavailable).
	Err() error
}

// Leases keeps one lease per node: a record that its holder renews and that the
// others read to learn whether the node is alive.
//
// Fencing rests on this contract:
//   - Acquire creates or takes over node's lease for holder with ttl and returns it
//     with the revision of that write. addrs, the node's addresses (cluster mode
//     without Kubernetes Nodes routes pods to them), are published with it: List
//     and every later Renew return them (Renew writes the lease's Addrs again:
//     renew what Acquire or Renew returned). A lease
//     written without addresses (an older agent) reads with none. Renew rewrites it; it fails with ErrConflict
//     when anybody else wrote the lease since (another holder took it over), and with
//     ErrNotFound when the server no longer has it (expired or deleted).
//   - A holder whose last successful Acquire or Renew was *sent* at monotonic time t
//     may act as the lease's holder until t+TTL (minus its margin): the server never
//     considers the lease expired earlier than that.
//   - Others judge expiry on their own monotonic clock: a lease whose Revision has not
//     changed for TTL since they first saw that revision, or that is gone, has expired
//     (Kubernetes has no server-side expiry; etcd's lease TTL gives the same bound).
//   - Renew and Release are compare-and-swap on l.Revision: a holder renewing from a
//     stale NodeLease (even its own older one) gets ErrConflict, and of two Renews
//     of the same NodeLease at most one succeeds.
//   - A node, holder or ttl that breaks the package comment's rules: ErrInvalid.
type Leases interface {
	Acquire(ctx context.Context, node, holder string, ttl time.Duration, addrs ...netip.Addr) (NodeLease, error)
	Renew(ctx context.Context, l NodeLease) (NodeLease, error)
	// Release deletes the lease if l is still current (a clean shutdown):
	// ErrConflict if somebody wrote it since, ErrNotFound if it is gone.
	Release(ctx context.Context, l NodeLease) error
	// List returns every node's lease as stored now, in node order. A lease the
	// server expired (etcd) is not listed; one that only observers judge expired
	// (Kubernetes) is.
	List(ctx context.Context) ([]NodeLease, error)
}

// NodeLease is one node's lease as its holder or an observer last saw it.
type NodeLease struct {
	Node     string
	Holder   string // who holds it: the agent's identity (node name + boot/process id)
	TTL      time.Duration
	Revision int64 // changes on every Acquire and Renew
	// ID is the implementation's handle (etcd lease ID, Kubernetes Lease UID).
	ID string
	// Addrs are the addresses the holder published with the lease (Acquire): the
	// node's addresses other nodes route its pods through. None from a holder that
	// published none.
	Addrs []netip.Addr
}

// LeaseKind is the kind reserved for Leases: Store methods refuse keys under it.
const LeaseKind = "nodes"

// CheckKey returns nil if key is kind "/" name by the package comment's rules, else
// an error wrapping ErrInvalid that names the key and the rule it breaks.
func CheckKey(key string) error {
	kind, name, ok := strings.Cut(key, "/")
	if !ok {
		return fmt.Errorf("%w: key %q: want kind/name, such as pools/net1 or blocks/net1/10-0-0-64-26", ErrInvalid, key)
	}
	if err := checkKind(fmt.Sprintf("key %q", key), kind); err != nil {
		return err
	}
	if len(name) > MaxName {
		return fmt.Errorf("%w: key %q: name is %d bytes, at most %d allowed", ErrInvalid, key, len(name), MaxName)
	}
	for _, seg := range strings.Split(name, "/") {
		if err := checkSegment(fmt.Sprintf("key %q", key), seg); err != nil {
			return err
		}
	}
	return nil
}

// CheckPrefix returns nil if prefix is kind "/" followed by zero or more whole name
// segments each ending in "/", else an error wrapping ErrInvalid that names it.
func CheckPrefix(prefix string) error {
	kind, rest, ok := strings.Cut(prefix, "/")
	if !ok {
		return fmt.Errorf("%w: prefix %q: want kind/ or kind/segment/..., such as blocks/ or blocks/net1/", ErrInvalid, prefix)
	}
	if err := checkKind(fmt.Sprintf("prefix %q", prefix), kind); err != nil {
		return err
	}
	if rest == "" {
		return nil
	}
	if !strings.HasSuffix(rest, "/") {
		return fmt.Errorf("%w: prefix %q: must end in \"/\" (whole segments only)", ErrInvalid, prefix)
	}
	rest = strings.TrimSuffix(rest, "/")
	if len(rest) >= MaxName {
		return fmt.Errorf("%w: prefix %q: longer than any name (at most %d bytes)", ErrInvalid, prefix, MaxName)
	}
	for _, seg := range strings.Split(rest, "/") {
		if err := checkSegment(fmt.Sprintf("prefix %q", prefix), seg); err != nil {
			return err
		}
	}
	return nil
}

// CheckValue returns nil if value is a JSON object of at most MaxValue bytes, else
// an error wrapping ErrInvalid that names key.
func CheckValue(key string, value []byte) error {
	if len(value) > MaxValue {
		return fmt.Errorf("%w: value of key %q is %d bytes, at most %d allowed", ErrInvalid, key, len(value), MaxValue)
	}
	trimmed := strings.TrimLeft(string(value), " \t\r\n")
	if !strings.HasPrefix(trimmed, "{") || !json.Valid(value) {
		return fmt.Errorf("%w: value of key %q is not a JSON object", ErrInvalid, key)
	}
	return nil
}

// CheckAddrs returns nil if addrs may be published with node's lease (the package
// comment's rules), else an error wrapping ErrInvalid that names the bad one.
func CheckAddrs(node string, addrs []netip.Addr) error {
	if len(addrs) > MaxAddrs {
		return fmt.Errorf("%w: lease of node %q: %d addresses, at most %d allowed", ErrInvalid, node, len(addrs), MaxAddrs)
	}
	for _, a := range addrs {
		if !a.IsValid() || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() {
			return fmt.Errorf("%w: lease of node %q: address %q: want a unicast address without zone", ErrInvalid, node, a)
		}
	}
	return nil
}

// CheckNode returns nil if node, holder and ttl may make a lease (the package
// comment's rules), else an error wrapping ErrInvalid that names the bad one.
func CheckNode(node, holder string, ttl time.Duration) error {
	if len(node) > MaxName {
		return fmt.Errorf("%w: lease node %q: %d bytes, at most %d allowed", ErrInvalid, node, len(node), MaxName)
	}
	if err := checkSegment(fmt.Sprintf("lease node %q", node), node); err != nil {
		return err
	}
	if holder == "" || len(holder) > MaxName {
		return fmt.Errorf("%w: lease of node %q: holder must be 1 to %d bytes, got %d", ErrInvalid, node, MaxName, len(holder))
	}
	for _, c := range []byte(holder) {
		if c < 0x21 || c > 0x7e {
			return fmt.Errorf("%w: lease of node %q: holder %q: only printable ASCII without spaces", ErrInvalid, node, holder)
		}
	}
	if ttl < time.Second || ttl%time.Second != 0 {
		return fmt.Errorf("%w: lease of node %q: ttl %v: must be a whole number of seconds, at least 1s", ErrInvalid, node, ttl)
	}
	return nil
}

func checkKind(what, kind string) error {
	if kind == "" || len(kind) > 63 || kind[0] < 'a' || kind[0] > 'z' {
		return fmt.Errorf("%w: %s: kind %q must be 1 to 63 bytes of [a-z0-9-] starting with a letter", ErrInvalid, what, kind)
	}
	for _, c := range []byte(kind) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("%w: %s: kind %q must be 1 to 63 bytes of [a-z0-9-] starting with a letter", ErrInvalid, what, kind)
		}
	}
	if kind == LeaseKind {
		return fmt.Errorf("%w: %s: kind %q is reserved for node leases (use Leases)", ErrInvalid, what, kind)
	}
	return nil
}

func checkSegment(what, seg string) error {
	if seg == "" {
		return fmt.Errorf("%w: %s: empty name segment (a leading, trailing or doubled \"/\")", ErrInvalid, what)
	}
	for _, c := range []byte(seg) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			return fmt.Errorf("%w: %s: name segment %q: only lowercase letters, digits, '.' and '-' (encode addresses such as 10-0-0-64-26)", ErrInvalid, what, seg)
		}
	}
	return nil
}
