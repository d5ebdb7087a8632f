// Package memds is an in-memory datastore.Store: the same contract as the etcd and
// Kubernetes backends (it passes the same conformance suite), for fast unit tests of
// what is built on the store. It is a fake beside the real backends, never instead
// of them: tests that prove cluster behaviour run against real servers too.
//
// Like etcd it keeps one revision counter for the whole store, a history of changes
// for watches (until Compact), and leases that expire by themselves, judged on the
// clock it is given (so a test with clocktest expires a lease by advancing time).
// SetAvailable(false) makes it behave like an unreachable server.
package memds

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/datastore"
)

// Store is a client of an in-memory datastore. The zero value is not usable; call
// New, and Open for more clients of the same data (other agents).
type Store struct {
	*shared
	closed atomic.Bool
}

// shared is the data every client of one store sees.
type shared struct {
	clk clock.Clock

	mu        sync.Mutex
	rev       int64 // the store's revision: that of the last change
	kvs       map[string]entry
	history   []datastore.Event // changes with Revision >= compactRv, in order
	compactRv int64             // history before this revision is gone
	watchers  map[*watch]struct{}
	leases    map[string]lease
	leaseID   int64
	down      bool
}

type entry struct {
	value []byte
	rev   int64
}

type lease struct {
	holder  string
	ttl     time.Duration
	rev     int64
	id      int64
	expires time.Duration // clk.Mono() after which the lease is gone
	addrs   []netip.Addr
}

var (
	_ datastore.Store  = (*Store)(nil)
	_ datastore.Leases = leases{}
	_ datastore.Watch  = (*watch)(nil)
)

// New returns a client of a new, empty store whose leases expire on clk's
// monotonic time.
func New(clk clock.Clock) *Store {
	return &Store{shared: &shared{
		clk:      clk,
		kvs:      map[string]entry{},
		watchers: map[*watch]struct{}{},
		leases:   map[string]lease{},
	}}
}

// Open returns another client of the same store, as a second process would have;
// closing one client leaves the others working.
func (s *Store) Open() *Store { return &Store{shared: s.shared} }

// Revision returns the store's current revision.
func (s *Store) Revision() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rev
}

// Compact discards the history of changes before rev: a Watch from a revision
// below rev-1 then fails with ErrCompacted (as etcd's compaction does).
func (s *Store) Compact(rev int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rev <= s.compactRv {
		return
	}
	s.compactRv = rev
	i := sort.Search(len(s.history), func(i int) bool { return s.history[i].KV.Revision >= rev })
	s.history = append([]datastore.Event(nil), s.history[i:]...)
}

// SetAvailable(false) makes every call fail with ErrUnavailable and ends every
// running watch with ErrUnavailable, as a server that went away would;
// SetAvailable(true) brings it back with its data.
func (s *Store) SetAvailable(up bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = !up
	if !up {
		for w := range s.watchers {
			w.end(fmt.Errorf("memds: watch of %q: %w: the store went away", w.prefix, datastore.ErrUnavailable))
			delete(s.watchers, w)
		}
	}
}

// Close ends this client's watches (with ErrUnavailable) and makes its further
// calls fail; other clients of the store go on.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed.Store(true)
	for w := range s.watchers {
		if w.owner == s {
			w.end(fmt.Errorf("memds: watch of %q: %w: store closed", w.prefix, datastore.ErrUnavailable))
			delete(s.watchers, w)
		}
	}
	return nil
}

// begin checks ctx and availability and takes the lock; the caller unlocks.
func (s *Store) begin(ctx context.Context, what string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memds: %s: %w", what, err)
	}
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		return fmt.Errorf("memds: %s: %w: store closed", what, datastore.ErrUnavailable)
	}
	if s.down {
		s.mu.Unlock()
		return fmt.Errorf("memds: %s: %w: store set unavailable", what, datastore.ErrUnavailable)
	}
	return nil
}

// Get returns key's value and revision.
func (s *Store) Get(ctx context.Context, key string) (datastore.KV, error) {
	if err := datastore.CheckKey(key); err != nil {
		return datastore.KV{}, err
	}
	if err := s.begin(ctx, "get "+key); err != nil {
		return datastore.KV{}, err
	}
	defer s.mu.Unlock()
	e, ok := s.kvs[key]
	if !ok {
		return datastore.KV{}, fmt.Errorf("memds: get %q: %w", key, datastore.ErrNotFound)
	}
	return datastore.KV{Key: key, Value: clone(e.value), Revision: e.rev}, nil
}

// Create stores value under key if key does not exist.
func (s *Store) Create(ctx context.Context, key string, value []byte) (int64, error) {
	if err := check(key, value); err != nil {
		return 0, err
	}
	if err := s.begin(ctx, "create "+key); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	if _, ok := s.kvs[key]; ok {
		return 0, fmt.Errorf("memds: create %q: %w", key, datastore.ErrExists)
	}
	return s.put(key, value), nil
}

// Update replaces key's value if its revision is rev.
func (s *Store) Update(ctx context.Context, key string, value []byte, rev int64) (int64, error) {
	if err := check(key, value); err != nil {
		return 0, err
	}
	if err := s.begin(ctx, "update "+key); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	e, ok := s.kvs[key]
	if !ok {
		return 0, fmt.Errorf("memds: update %q: %w", key, datastore.ErrNotFound)
	}
	if e.rev != rev {
		return 0, fmt.Errorf("memds: update %q at revision %d: %w (now %d)", key, rev, datastore.ErrConflict, e.rev)
	}
	return s.put(key, value), nil
}

// Delete removes key if its revision is rev.
func (s *Store) Delete(ctx context.Context, key string, rev int64) error {
	if err := datastore.CheckKey(key); err != nil {
		return err
	}
	if err := s.begin(ctx, "delete "+key); err != nil {
		return err
	}
	defer s.mu.Unlock()
	e, ok := s.kvs[key]
	if !ok {
		return fmt.Errorf("memds: delete %q: %w", key, datastore.ErrNotFound)
	}
	if e.rev != rev {
		return fmt.Errorf("memds: delete %q at revision %d: %w (now %d)", key, rev, datastore.ErrConflict, e.rev)
	}
	s.rev++
	delete(s.kvs, key)
	s.publish(datastore.Event{Type: datastore.Deleted, KV: datastore.KV{Key: key, Revision: s.rev}})
	return nil
}

// put stores value under key at the next revision and tells the watchers; s.mu held.
func (s *Store) put(key string, value []byte) int64 {
	s.rev++
	v := clone(value)
	s.kvs[key] = entry{value: v, rev: s.rev}
	s.publish(datastore.Event{Type: datastore.Put, KV: datastore.KV{Key: key, Value: v, Revision: s.rev}})
	return s.rev
}

// publish records ev in the history and queues it for every watcher of its key;
// s.mu held.
func (s *Store) publish(ev datastore.Event) {
	s.history = append(s.history, ev)
	for w := range s.watchers {
		if strings.HasPrefix(ev.KV.Key, w.prefix) {
			w.push(ev)
		}
	}
}

// List returns every key under prefix in key order and the store's revision.
func (s *Store) List(ctx context.Context, prefix string) ([]datastore.KV, int64, error) {
	if err := datastore.CheckPrefix(prefix); err != nil {
		return nil, 0, err
	}
	if err := s.begin(ctx, "list "+prefix); err != nil {
		return nil, 0, err
	}
	defer s.mu.Unlock()
	var out []datastore.KV
	for k, e := range s.kvs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, datastore.KV{Key: k, Value: clone(e.value), Revision: e.rev})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, s.rev, nil
}

// Watch streams every change under prefix after revision from.
func (s *Store) Watch(ctx context.Context, prefix string, from int64) (datastore.Watch, error) {
	if err := datastore.CheckPrefix(prefix); err != nil {
		return nil, err
	}
	if err := s.begin(ctx, "watch "+prefix); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if from+1 < s.compactRv {
		return nil, fmt.Errorf("memds: watch %q from revision %d: %w (history starts at %d)", prefix, from, datastore.ErrCompacted, s.compactRv)
	}
	w := &watch{owner: s, prefix: prefix, ch: make(chan datastore.Event), wake: make(chan struct{}, 1)}
	i := sort.Search(len(s.history), func(i int) bool { return s.history[i].KV.Revision > from })
	for _, ev := range s.history[i:] {
		if strings.HasPrefix(ev.KV.Key, prefix) {
			w.queue = append(w.queue, ev)
		}
	}
	s.watchers[w] = struct{}{}
	go w.run(ctx, s)
	return w, nil
}

// watch is one running watch: an unbounded queue filled under the store's lock and
// drained into ch by its own goroutine, so a slow reader never blocks a writer and
// no event is ever dropped.
type watch struct {
	owner  *Store
	prefix string
	ch     chan datastore.Event
	wake   chan struct{} // one pending wake-up

	mu    sync.Mutex
	queue []datastore.Event
	ended bool
	cause error // why the store ended the watch
	err   error // what Err returns, set before ch closes
}

func (w *watch) Events() <-chan datastore.Event { return w.ch }

func (w *watch) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *watch) push(ev datastore.Event) {
	w.mu.Lock()
	w.queue = append(w.queue, ev)
	w.mu.Unlock()
	w.signal()
}

func (w *watch) end(cause error) {
	w.mu.Lock()
	w.ended, w.cause = true, cause
	w.mu.Unlock()
	w.signal()
}

func (w *watch) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *watch) run(ctx context.Context, s *Store) {
	finish := func(err error) {
		s.mu.Lock()
		delete(s.watchers, w)
		s.mu.Unlock()
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
		close(w.ch)
	}
	for {
		w.mu.Lock()
		q, ended, cause := w.queue, w.ended, w.cause
		w.queue = nil
		w.mu.Unlock()
		for _, ev := range q {
			select {
			case w.ch <- ev:
			case <-ctx.Done():
				finish(nil)
				return
			}
		}
		if ended {
			finish(cause)
			return
		}
		select {
		case <-w.wake:
		case <-ctx.Done():
			finish(nil)
			return
		}
	}
}

// Leases returns the store's node leases.
func (s *Store) Leases() datastore.Leases { return leases{s} }

type leases struct{ s *Store }

// expire drops the leases whose TTL has run out; s.mu held.
func (s *Store) expire() {
	now := s.clk.Mono()
	for n, l := range s.leases {
		if now > l.expires {
			delete(s.leases, n)
			s.rev++ // etcd deletes the lease's key: a change
		}
	}
}

func (l leases) Acquire(ctx context.Context, node, holder string, ttl time.Duration, addrs ...netip.Addr) (datastore.NodeLease, error) {
	if err := datastore.CheckNode(node, holder, ttl); err != nil {
		return datastore.NodeLease{}, err
	}
	if err := datastore.CheckAddrs(node, addrs); err != nil {
		return datastore.NodeLease{}, err
	}
	s := l.s
	if err := s.begin(ctx, "acquire lease of "+node); err != nil {
		return datastore.NodeLease{}, err
	}
	defer s.mu.Unlock()
	s.expire()
	s.rev++
	s.leaseID++
	nl := lease{holder: holder, ttl: ttl, rev: s.rev, id: s.leaseID, expires: s.clk.Mono() + ttl, addrs: slices.Clone(addrs)}
	s.leases[node] = nl
	return nl.public(node), nil
}

func (l leases) current(what string, nl datastore.NodeLease) (lease, error) {
	s := l.s
	s.expire()
	cur, ok := s.leases[nl.Node]
	if !ok {
		return lease{}, fmt.Errorf("memds: %s lease of %q: %w (expired or released)", what, nl.Node, datastore.ErrNotFound)
	}
	if cur.rev != nl.Revision {
		return lease{}, fmt.Errorf("memds: %s lease of %q at revision %d: %w (now %d, holder %s)", what, nl.Node, nl.Revision, datastore.ErrConflict, cur.rev, cur.holder)
	}
	return cur, nil
}

func (l leases) Renew(ctx context.Context, nl datastore.NodeLease) (datastore.NodeLease, error) {
	if err := datastore.CheckNode(nl.Node, nl.Holder, nl.TTL); err != nil {
		return datastore.NodeLease{}, err
	}
	s := l.s
	if err := s.begin(ctx, "renew lease of "+nl.Node); err != nil {
		return datastore.NodeLease{}, err
	}
	defer s.mu.Unlock()
	cur, err := l.current("renew", nl)
	if err != nil {
		return datastore.NodeLease{}, err
	}
	s.rev++
	cur.rev, cur.expires = s.rev, s.clk.Mono()+cur.ttl
	s.leases[nl.Node] = cur
	return cur.public(nl.Node), nil
}

func (l leases) Release(ctx context.Context, nl datastore.NodeLease) error {
	if err := datastore.CheckNode(nl.Node, nl.Holder, nl.TTL); err != nil {
		return err
	}
	s := l.s
	if err := s.begin(ctx, "release lease of "+nl.Node); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if _, err := l.current("release", nl); err != nil {
		return err
	}
	s.rev++
	delete(s.leases, nl.Node)
	return nil
}

func (l leases) List(ctx context.Context) ([]datastore.NodeLease, error) {
	s := l.s
	if err := s.begin(ctx, "list leases"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	s.expire()
	out := make([]datastore.NodeLease, 0, len(s.leases))
	for n, nl := range s.leases {
		out = append(out, nl.public(n))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}

func (l lease) public(node string) datastore.NodeLease {
	return datastore.NodeLease{Node: node, Holder: l.holder, TTL: l.ttl, Revision: l.rev, ID: strconv.FormatInt(l.id, 10), Addrs: slices.Clone(l.addrs)}
}

func check(key string, value []byte) error {
	if err := datastore.CheckKey(key); err != nil {
		return err
	}
	return datastore.CheckValue(key, value)
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }
