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
package datastore

import (
	"context"
	"errors"
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
//     revision. Of two callers that read the same revision, at most one succeeds.
//   - List returns every key under prefix in key order, and the store revision the
//     list was read at (at least every returned KV's Revision).
//   - Watch streams, in order, every change under prefix after revision from (List's
//     revision), without gaps or duplicates, until ctx ends; then the channel is
//     closed. If the stream breaks (server restart, compaction), the channel is closed
//     after an Event-less error reported by Err on the returned Watch; the caller lists
//     again.
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
//     with the revision of that write. Renew rewrites it; it fails with ErrConflict
//     when anybody else wrote the lease since (another holder took it over), and with
//     ErrNotFound when the server no longer has it (expired or deleted).
//   - A holder whose last successful Acquire or Renew was *sent* at monotonic time t
//     may act as the lease's holder until t+TTL (minus its margin): the server never
//     considers the lease expired earlier than that.
//   - Others judge expiry on their own monotonic clock: a lease whose Revision has not
//     changed for TTL since they first saw that revision, or that is gone, has expired
//     (Kubernetes has no server-side expiry; etcd's lease TTL gives the same bound).
type Leases interface {
	Acquire(ctx context.Context, node, holder string, ttl time.Duration) (NodeLease, error)
	Renew(ctx context.Context, l NodeLease) (NodeLease, error)
	// Release deletes the lease if l is still current (a clean shutdown).
	Release(ctx context.Context, l NodeLease) error
	// List returns every node's lease as stored now.
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
}
