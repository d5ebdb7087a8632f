// Package datastoretest is the conformance suite of datastore.Store: every point of
// the contract in package datastore, checked against an implementation that a test
// opens on a real server (etcd, kube-apiserver) or in memory.
//
// Use:
//
//	func TestConformance(t *testing.T) {
//		srv := ... // a real server
//		datastoretest.Run(t, func(t *testing.T) datastore.Store { return open(t, srv) }, datastoretest.Options{...})
//	}
//
// Every subtest opens its own Store with open and works under keys no other subtest
// uses (blocks/<unique>/..., pools/<unique>...), so open may hand out stores on one
// shared server. The suite closes what open returns. Each subtest ends with an audit
// of the keys it used (List sorted and consistent with Get, revisions at most the
// List's) in t.Cleanup.
package datastoretest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/datastore"
)

// Options tells the suite what the implementation and its server can do. A feature
// left out must be explained: its tests are then skipped with that reason, never
// silently.
type Options struct {
	// Compact discards the server's history up to and including rev, so that a Watch
	// from before rev fails with ErrCompacted. Nil: set NoCompact to the reason.
	Compact   func(t *testing.T, rev int64)
	NoCompact string

	// Stop makes the server unavailable (stops it, keeping its data) and returns a
	// function that starts it again. Nil: set NoStop to the reason.
	Stop   func(t *testing.T) (start func())
	NoStop string

	// LeaseTTL is the TTL the lease tests use; 0 means 2s. Use the shortest the
	// server honours (etcd raises a TTL to its minimum, 2s with default timings).
	LeaseTTL time.Duration
	// NoExpiry, when set, says why the server never expires a lease by itself
	// (Kubernetes: observers judge expiry), and skips the expiry test. Empty: the
	// suite waits for an unrenewed lease to disappear and Renew to fail with
	// ErrNotFound.
	NoExpiry string

	// Writers and WritesPerWriter size the watch test (defaults 4 and 75).
	Writers, WritesPerWriter int
}

// Timeout bounds each wait in the suite (for an event, for a server to come back);
// it is generous because the machine may be slow, and nothing asserts speed.
const Timeout = 90 * time.Second

// DownTimeout bounds each call a test makes while its server is down, which
// must fail with ErrUnavailable (the test waits this long for each): 3 s, and
// 1 s under -short, where a deadline's mapping is as well checked sooner.
func DownTimeout() time.Duration {
	if testing.Short() {
		return time.Second
	}
	return 3 * time.Second
}

// Run runs the conformance suite against stores that open returns.
func Run(t *testing.T, open func(t *testing.T) datastore.Store, opts Options) {
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = 2 * time.Second
	}
	if opts.Writers == 0 {
		opts.Writers = 4
	}
	if opts.WritesPerWriter == 0 {
		opts.WritesPerWriter = 75
	}
	s := &suite{open: open, opts: opts}
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"CreateGet", s.testCreateGet},
		{"NamedPoolSpec", s.testNamedPoolSpec},
		{"ReservationSpec", s.testReservationSpec},
		{"UpdateCAS", s.testUpdateCAS},
		{"DeleteCAS", s.testDeleteCAS},
		{"RacingUpdatesOneWinner", s.testRacingUpdates},
		{"RacingCreatesOneWinner", s.testRacingCreates},
		{"RacingDeletesOneWinner", s.testRacingDeletes},
		{"ListOrderAndRevision", s.testList},
		{"WatchEveryChangeInOrder", s.testWatchEveryChange},
		{"WatchDeletedEvents", s.testWatchDeleted},
		{"WatchEndsWithContext", s.testWatchEndsWithContext},
		{"WatchCompacted", s.testWatchCompacted},
		{"Invalid", s.testInvalid},
		{"ContextCanceled", s.testContextCanceled},
		{"Unavailable", s.testUnavailable},
		{"LeaseAcquireRenewRelease", s.testLeaseLifecycle},
		{"LeaseTakeover", s.testLeaseTakeover},
		{"LeaseRacingRenews", s.testLeaseRacingRenews},
		{"LeaseExpiry", s.testLeaseExpiry},
		{"LeaseInvalid", s.testLeaseInvalid},
		{"LeaseAddrs", s.testLeaseAddrs},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.fn)
	}
}

type suite struct {
	open func(t *testing.T) datastore.Store
	opts Options
}

// store opens a store for t, closes it in t.Cleanup and returns it with a name
// segment unique to this test (for keys blocks/<seg>/... and pools/<seg>-...).
// Every key under blocks/<seg>/ is audited when t ends.
func (s *suite) store(t *testing.T) (datastore.Store, string) {
	t.Helper()
	st := s.open(t)
	if st == nil {
		t.Fatal("open returned a nil Store")
	}
	seg := uniq(t)
	t.Cleanup(func() {
		audit(t, st, "blocks/"+seg+"/")
		if err := st.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return st, seg
}

// uniq returns a name segment unique to this run and test: the test's name made
// lowercase [a-z0-9-] (shortened) and random hex.
func uniq(t *testing.T) string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name := t.Name()
	if i := strings.LastIndex(name, "/"); i >= 0 {
		name = name[i+1:]
	}
	var sb strings.Builder
	for _, c := range strings.ToLower(name) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			sb.WriteRune(c)
		}
		if sb.Len() >= 24 {
			break
		}
	}
	return sb.String() + "-" + hex.EncodeToString(b[:])
}

// audit checks, at the end of a test, what any reader relies on for the keys under
// prefix: List is in key order without duplicates, every revision is at most the
// List's, and Get agrees with List for every key.
func audit(t *testing.T, st datastore.Store, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	kvs, rev, err := st.List(ctx, prefix)
	if err != nil {
		t.Errorf("audit: List(%q): %v", prefix, err)
		return
	}
	for i, kv := range kvs {
		if !strings.HasPrefix(kv.Key, prefix) {
			t.Errorf("audit: List(%q) returned %q, outside the prefix", prefix, kv.Key)
		}
		if i > 0 && kvs[i-1].Key >= kv.Key {
			t.Errorf("audit: List(%q) not in strict key order: %q then %q", prefix, kvs[i-1].Key, kv.Key)
		}
		if kv.Revision <= 0 || kv.Revision > rev {
			t.Errorf("audit: %q has revision %d, want 1..%d (the List's)", kv.Key, kv.Revision, rev)
		}
		got, err := st.Get(ctx, kv.Key)
		if err != nil {
			t.Errorf("audit: Get(%q) of a listed key: %v", kv.Key, err)
			continue
		}
		// Nothing else writes these keys once the test ends.
		if got.Revision != kv.Revision || !sameJSON(got.Value, kv.Value) {
			t.Errorf("audit: Get(%q) = rev %d %s, List had rev %d %s", kv.Key, got.Revision, got.Value, kv.Revision, kv.Value)
		}
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	t.Cleanup(cancel)
	return ctx
}

// val returns a JSON object value.
func val(format string, args ...any) []byte {
	b, _ := json.Marshal(map[string]string{"v": fmt.Sprintf(format, args...)})
	return b
}

// sameJSON reports whether a and b are the same JSON value (a store may re-encode).
func sameJSON(a, b []byte) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func mustCreate(t *testing.T, st datastore.Store, key string, value []byte) int64 {
	t.Helper()
	rev, err := st.Create(ctxT(t), key, value)
	if err != nil {
		t.Fatalf("Create(%q): %v", key, err)
	}
	if rev <= 0 {
		t.Fatalf("Create(%q) returned revision %d, want > 0", key, rev)
	}
	return rev
}

func wantGet(t *testing.T, st datastore.Store, key string, value []byte, rev int64) {
	t.Helper()
	kv, err := st.Get(ctxT(t), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	if kv.Key != key || kv.Revision != rev || !sameJSON(kv.Value, value) {
		t.Fatalf("Get(%q) = {%q %s rev %d}, want {%q %s rev %d}", key, kv.Key, kv.Value, kv.Revision, key, value, rev)
	}
}

func wantErr(t *testing.T, what string, err, sentinel error) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("%s: error %v, want one wrapping %v", what, err, sentinel)
	}
}

// testNamedPoolSpec: an IPPool's spec as an operator writes it (range sets, a
// block size, a node selector whose keys hold '/' and '.') is stored and read back
// with its meaning, by Get and by List of "pools/".
func (s *suite) testNamedPoolSpec(t *testing.T) {
	st, seg := s.store(t)
	ctx := ctxT(t)
	key := "pools/" + seg
	v := []byte(`{"ranges":[[{"subnet":"10.50.0.0/16"}],[{"subnet":"fd50::/64","rangeStart":"fd50::10"}]],"blockSize":28,"nodeSelector":{"topology.kubernetes.io/zone":"b","pool.example/tier":"gold"}}`)
	rev := mustCreate(t, st, key, v)
	wantGet(t, st, key, v, rev)
	kvs, _, err := st.List(ctx, "pools/")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range kvs {
		if kv.Key == key {
			if kv.Revision != rev || !sameJSON(kv.Value, v) {
				t.Fatalf("List: %s rev %d, want %s rev %d", kv.Value, kv.Revision, v, rev)
			}
			return
		}
	}
	t.Fatalf("List(pools/) lacks %s: %v", key, kvs)
}

// testReservationSpec: an IPReservation's spec (addresses and CIDRs of both
// families, a reason) is stored under "reservations/<name>", read back with its
// meaning by Get and List of "reservations/", its changes seen by a Watch of that
// prefix, and its Delete too.
func (s *suite) testReservationSpec(t *testing.T) {
	st, seg := s.store(t)
	ctx := ctxT(t)
	key := "reservations/" + seg
	_, from, err := st.List(ctx, "reservations/")
	if err != nil {
		t.Fatal(err)
	}
	w, err := st.Watch(ctx, "reservations/", from)
	if err != nil {
		t.Fatal(err)
	}
	v := []byte(`{"addresses":["10.244.1.2","10.244.1.240/28","fd00:10:244::/120"],"reason":"routers of rack 4"}`)
	rev := mustCreate(t, st, key, v)
	wantGet(t, st, key, v, rev)
	kvs, _, err := st.List(ctx, "reservations/")
	if err != nil {
		t.Fatal(err)
	}
	if i := indexKey(kvs, key); i < 0 || kvs[i].Revision != rev || !sameJSON(kvs[i].Value, v) {
		t.Fatalf("List(reservations/) = %v, want %s at rev %d holding %s", kvs, key, rev, v)
	}
	v2 := []byte(`{"addresses":["10.244.1.2"]}`)
	rev2, err := st.Update(ctx, key, v2, rev)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(ctx, key, rev2); err != nil {
		t.Fatal(err)
	}
	values := map[int64][]byte{rev: v, rev2: v2}
	var got []string
	for _, ev := range collect(t, w, 3) {
		switch {
		case ev.KV.Key != key:
			got = append(got, "other key "+ev.KV.Key)
		case ev.Type == datastore.Put:
			got = append(got, fmt.Sprintf("put %d, value as written: %v", ev.KV.Revision, sameJSON(ev.KV.Value, values[ev.KV.Revision])))
		default:
			got = append(got, "deleted")
		}
	}
	want := []string{fmt.Sprintf("put %d, value as written: true", rev), fmt.Sprintf("put %d, value as written: true", rev2), "deleted"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("watch of reservations/: %q, want %q", got, want)
	}
}

func indexKey(kvs []datastore.KV, key string) int {
	for i, kv := range kvs {
		if kv.Key == key {
			return i
		}
	}
	return -1
}

func (s *suite) testCreateGet(t *testing.T) {
	st, seg := s.store(t)
	ctx := ctxT(t)
	key := "blocks/" + seg + "/10-0-0-0-26"
	if _, err := st.Get(ctx, key); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("Get of a missing key: %v, want ErrNotFound", err)
	}
	v1 := []byte(`{"owner":"node-a","epoch":1,"cidr":"10.0.0.0/26"}`)
	rev := mustCreate(t, st, key, v1)
	wantGet(t, st, key, v1, rev)

	_, err := st.Create(ctx, key, val("again"))
	wantErr(t, "Create of an existing key", err, datastore.ErrExists)
	if !strings.Contains(err.Error(), key) {
		t.Errorf("ErrExists does not name the key: %v", err)
	}
	wantGet(t, st, key, v1, rev) // the failed Create changed nothing

	// A one-segment key (pools/<network>) and a second key: revisions grow across keys.
	pool := "pools/" + seg
	rev2 := mustCreate(t, st, pool, val("pool"))
	if rev2 <= rev {
		t.Fatalf("a later Create got revision %d, not above the earlier %d", rev2, rev)
	}
	wantGet(t, st, pool, val("pool"), rev2)
	if err := st.Delete(ctx, pool, rev2); err != nil {
		t.Fatalf("Delete(%q): %v", pool, err)
	}

	// A value of exactly MaxValue bytes is accepted and read back whole.
	big := jsonOfSize(datastore.MaxValue)
	bkey := "blocks/" + seg + "/big"
	brev := mustCreate(t, st, bkey, big)
	wantGet(t, st, bkey, big, brev)
}

// jsonOfSize returns a JSON object of exactly n bytes (n >= 8).
func jsonOfSize(n int) []byte {
	b := []byte(`{"v":"`)
	b = append(b, bytes.Repeat([]byte("x"), n-len(b)-2)...)
	return append(b, `"}`...)
}

func (s *suite) testUpdateCAS(t *testing.T) {
	st, seg := s.store(t)
	ctx := ctxT(t)
	key := "blocks/" + seg + "/b"
	rev1 := mustCreate(t, st, key, val("1"))
	rev2, err := st.Update(ctx, key, val("2"), rev1)
	if err != nil {
		t.Fatalf("Update at the current revision: %v", err)
	}
	if rev2 <= rev1 {
		t.Fatalf("Update returned revision %d, not above %d", rev2, rev1)
	}
	wantGet(t, st, key, val("2"), rev2)

	_, err = st.Update(ctx, key, val("stale"), rev1)
	wantErr(t, "Update at a stale revision", err, datastore.ErrConflict)
	if !strings.Contains(err.Error(), key) {
		t.Errorf("ErrConflict does not name the key: %v", err)
	}
	wantGet(t, st, key, val("2"), rev2)

	// A revision from the future is not the current one either.
	_, err = st.Update(ctx, key, val("future"), rev2+1000)
	wantErr(t, "Update at a future revision", err, datastore.ErrConflict)

	_, err = st.Update(ctx, "blocks/"+seg+"/missing", val("x"), rev2)
	wantErr(t, "Update of a missing key", err, datastore.ErrNotFound)
	if _, err := st.Get(ctx, "blocks/"+seg+"/missing"); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("Update of a missing key created it: Get says %v", err)
	}

	// An Update that writes the same value still moves the revision.
	rev3, err := st.Update(ctx, key, val("2"), rev2)
	if err != nil || rev3 <= rev2 {
		t.Fatalf("Update with an unchanged value: rev %d, err %v; want a revision above %d", rev3, err, rev2)
	}
	wantGet(t, st, key, val("2"), rev3)
}

func (s *suite) testDeleteCAS(t *testing.T) {
	st, seg := s.store(t)
	ctx := ctxT(t)
	key := "blocks/" + seg + "/d"
	rev1 := mustCreate(t, st, key, val("1"))
	rev2, err := st.Update(ctx, key, val("2"), rev1)
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, "Delete at a stale revision", st.Delete(ctx, key, rev1), datastore.ErrConflict)
	wantGet(t, st, key, val("2"), rev2)
	if err := st.Delete(ctx, key, rev2); err != nil {
		t.Fatalf("Delete at the current revision: %v", err)
	}
	if _, err := st.Get(ctx, key); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("Get after Delete: %v, want ErrNotFound", err)
	}
	wantErr(t, "Delete of a deleted key", st.Delete(ctx, key, rev2), datastore.ErrNotFound)
	_, err = st.Update(ctx, key, val("3"), rev2)
	wantErr(t, "Update of a deleted key", err, datastore.ErrNotFound)

	// Re-created, the key has a new revision; the old one no longer deletes it.
	rev3 := mustCreate(t, st, key, val("new"))
	if rev3 <= rev2 {
		t.Fatalf("re-created key has revision %d, not above %d", rev3, rev2)
	}
	wantErr(t, "Delete of a re-created key at its old revision", st.Delete(ctx, key, rev2), datastore.ErrConflict)
	wantGet(t, st, key, val("new"), rev3)
}

const racers = 16

// race runs fn in racers goroutines released at once and returns their errors.
func race(fn func(i int) error) []error {
	errs := make([]error, racers)
	var start, done sync.WaitGroup
	start.Add(1)
	for i := range racers {
		done.Go(func() {
			start.Wait()
			errs[i] = fn(i)
		})
	}
	start.Done()
	done.Wait()
	return errs
}

// oneWinner checks that exactly one of errs is nil and the others wrap loser.
func oneWinner(t *testing.T, what string, errs []error, loser error) int {
	t.Helper()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Fatalf("%s: racers %d and %d both succeeded", what, winner, i)
			}
			winner = i
		case !errors.Is(err, loser):
			t.Fatalf("%s: racer %d: %v, want nil or %v", what, i, err, loser)
		}
	}
	if winner < 0 {
		t.Fatalf("%s: no racer succeeded", what)
	}
	return winner
}

func (s *suite) testRacingUpdates(t *testing.T) {
	st, seg := s.store(t)
	ctx := ctxT(t)
	key := "blocks/" + seg + "/last-free"
	rev := mustCreate(t, st, key, val("free"))
	for round := range 3 {
		revs := make([]int64, racers)
		errs := race(func(i int) error {
			var err error
			revs[i], err = st.Update(ctx, key, val("round %d owner %d", round, i), rev)
			return err
		})
		w := oneWinner(t, fmt.Sprintf("round %d: %d Updates of one revision", round, racers), errs, datastore.ErrConflict)
		wantGet(t, st, key, val("round %d owner %d", round, w), revs[w])
		rev = revs[w]
	}
}

func (s *suite) testRacingCreates(t *testing.T) {
	st, seg := s.store(t)
	ctx := ctxT(t)
	key := "blocks/" + seg + "/claimed"
	revs := make([]int64, racers)
	errs := race(func(i int) error {
		var err error
		revs[i], err = st.Create(ctx, key, val("owner %d", i))
		return err
	})
	w := oneWinner(t, fmt.Sprintf("%d Creates of one key", racers), errs, datastore.ErrExists)
	wantGet(t, st, key, val("owner %d", w), revs[w])
}

func (s *suite) testRacingDeletes(t *testing.T) {
	st, seg := s.store(t)
	ctx := ctxT(t)
	key := "blocks/" + seg + "/handback"
	rev := mustCreate(t, st, key, val("empty"))
	errs := race(func(int) error { return st.Delete(ctx, key, rev) })
	// A loser sees the key gone (ErrNotFound) or, on a store that checks the
	// revision first, changed (ErrConflict); both say "not yours any more".
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Fatalf("racers %d and %d both deleted the key", winner, i)
			}
			winner = i
		case !errors.Is(err, datastore.ErrNotFound) && !errors.Is(err, datastore.ErrConflict):
			t.Fatalf("racer %d: %v, want nil, ErrNotFound or ErrConflict", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no racer deleted the key")
	}
	if _, err := st.Get(ctx, key); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("Get after the racing deletes: %v", err)
	}
}

func (s *suite) testList(t *testing.T) {
	st, seg := s.store(t)
	ctx := ctxT(t)
	base := "blocks/" + seg
	// A sibling whose name extends seg: a whole-segment prefix must not match it.
	sibling := "blocks/" + seg + "0/x"
	mustCreate(t, st, sibling, val("sibling"))
	t.Cleanup(func() { audit(t, st, "blocks/"+seg+"0/") })

	empty, rev0, err := st.List(ctx, base+"/")
	if err != nil || len(empty) != 0 || rev0 <= 0 {
		t.Fatalf("List of an empty prefix = %d keys, rev %d, err %v; want none, rev > 0", len(empty), rev0, err)
	}

	// 250 keys, created by 8 writers in scrambled order (enough to cross an
	// implementation's page size if it pages by a few hundred or fewer).
	const n = 250
	want := map[string]int64{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				k := fmt.Sprintf("%s/%03d", base, (i*37)%n)
				rev, err := st.Create(ctx, k, val("%d", i))
				if err != nil {
					errc <- fmt.Errorf("Create(%q): %w", k, err)
					return
				}
				mu.Lock()
				want[k] = rev
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if len(want) != n {
		t.Fatalf("created %d keys, want %d", len(want), n)
	}
	var maxRev int64
	for _, r := range want {
		maxRev = max(maxRev, r)
	}
	kvs, rev, err := st.List(ctx, base+"/")
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(kvs) != n {
		t.Fatalf("List returned %d keys, want %d", len(kvs), n)
	}
	if rev < maxRev {
		t.Fatalf("List revision %d is below the last write's %d", rev, maxRev)
	}
	for i, kv := range kvs {
		if i > 0 && kvs[i-1].Key >= kv.Key {
			t.Fatalf("List not in key order at %d: %q then %q", i, kvs[i-1].Key, kv.Key)
		}
		if r, ok := want[kv.Key]; !ok || r != kv.Revision {
			t.Fatalf("List returned %q at revision %d; created at %d (known %v)", kv.Key, kv.Revision, r, ok)
		}
	}
	// A list of the whole kind holds these and the sibling.
	all, _, err := st.List(ctx, "blocks/")
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, kv := range all {
		if strings.HasPrefix(kv.Key, base+"/") || kv.Key == sibling {
			found++
		}
	}
	if found != n+1 {
		t.Fatalf("List(blocks/) holds %d of this test's %d keys", found, n+1)
	}
	// After an update, List shows the new revision and a List revision at least it.
	k := base + "/000"
	nr, err := st.Update(ctx, k, val("updated"), want[k])
	if err != nil {
		t.Fatal(err)
	}
	kvs, rev, err = st.List(ctx, base+"/")
	if err != nil {
		t.Fatal(err)
	}
	if kvs[0].Key != k || kvs[0].Revision != nr || !sameJSON(kvs[0].Value, val("updated")) || rev < nr {
		t.Fatalf("List after Update: first %q rev %d %s, list rev %d; want %q rev %d", kvs[0].Key, kvs[0].Revision, kvs[0].Value, rev, k, nr)
	}
}

// op is one write a watch test made, to compare with the events it sees.
type op struct {
	typ   datastore.EventType
	key   string
	value []byte
	rev   int64 // the revision the write returned; 0 for Delete (it returns none)
}

// collect reads events from w until want have arrived, ctx ends or the channel
// closes.
func collect(t *testing.T, w datastore.Watch, want int) []datastore.Event {
	t.Helper()
	var got []datastore.Event
	timer := time.NewTimer(Timeout)
	defer timer.Stop()
	for len(got) < want {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				t.Fatalf("watch closed after %d of %d events: Err %v", len(got), want, w.Err())
			}
			got = append(got, ev)
		case <-timer.C:
			t.Fatalf("%d of %d events arrived within %v", len(got), want, Timeout)
		}
	}
	return got
}

// checkEvents checks that events are exactly the writes in ops, each key's in the
// order its writer made them, with strictly increasing revisions overall.
func checkEvents(t *testing.T, events []datastore.Event, ops []op, from int64) {
	t.Helper()
	if len(events) != len(ops) {
		t.Fatalf("%d events for %d writes", len(events), len(ops))
	}
	perKey := map[string][]op{}
	for _, o := range ops {
		perKey[o.key] = append(perKey[o.key], o)
	}
	last := from
	for i, ev := range events {
		if ev.KV.Revision <= last {
			t.Fatalf("event %d (%v %q) has revision %d, not above the previous %d (duplicate, replay or disorder)", i, ev.Type, ev.KV.Key, ev.KV.Revision, last)
		}
		last = ev.KV.Revision
		q := perKey[ev.KV.Key]
		if len(q) == 0 {
			t.Fatalf("event %d: %v %q rev %d matches no write left on that key", i, ev.Type, ev.KV.Key, ev.KV.Revision)
		}
		o := q[0]
		perKey[ev.KV.Key] = q[1:]
		if ev.Type != o.typ {
			t.Fatalf("event %d on %q: type %v, want %v (rev %d)", i, ev.KV.Key, ev.Type, o.typ, ev.KV.Revision)
		}
		if o.typ == datastore.Put && (ev.KV.Revision != o.rev || !sameJSON(ev.KV.Value, o.value)) {
			t.Fatalf("event %d on %q: rev %d %s, want rev %d %s", i, ev.KV.Key, ev.KV.Revision, ev.KV.Value, o.rev, o.value)
		}
	}
}

func (s *suite) testWatchEveryChange(t *testing.T) {
	st, seg := s.store(t)
	ctx := ctxT(t)
	base := "blocks/" + seg + "/"
	other := "blocks/" + seg + "x/" // outside the watched prefix
	t.Cleanup(func() { audit(t, st, other) })
	mustCreate(t, st, base+"before", val("before the list"))
	_, from, err := st.List(ctx, base)
	if err != nil {
		t.Fatal(err)
	}

	// Each writer owns its keys and cycles them through create, updates and delete;
	// it also writes outside the prefix. Half the writes happen before the watch
	// starts (replayed from history), half while it runs.
	writers, per := s.opts.Writers, s.opts.WritesPerWriter
	opsBy := make([][]op, writers)
	write := func(w, lo, hi int) error {
		for i := lo; i < hi; i++ {
			key := fmt.Sprintf("%sw%d-k%d", base, w, i/5)
			var o op
			var err error
			switch i % 5 {
			case 0:
				o = op{typ: datastore.Put, key: key, value: val("w%d i%d", w, i)}
				o.rev, err = st.Create(ctx, key, o.value)
			case 1, 2, 3:
				prev := opsBy[w][len(opsBy[w])-1].rev
				o = op{typ: datastore.Put, key: key, value: val("w%d i%d", w, i)}
				o.rev, err = st.Update(ctx, key, o.value, prev)
			case 4:
				prev := opsBy[w][len(opsBy[w])-1].rev
				o = op{typ: datastore.Deleted, key: key}
				err = st.Delete(ctx, key, prev)
			}
			if err != nil {
				return fmt.Errorf("writer %d write %d on %q: %w", w, i, key, err)
			}
			opsBy[w] = append(opsBy[w], o)
			if i%10 == 0 {
				if _, err := st.Create(ctx, fmt.Sprintf("%sw%d-%d", other, w, i), val("noise")); err != nil {
					return err
				}
			}
		}
		return nil
	}
	runWriters := func(lo, hi int) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, writers)
		for w := range writers {
			wg.Go(func() { errs[w] = write(w, lo, hi) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	}
	half := (per / 2 / 5) * 5 // a whole number of key cycles
	runWriters(0, half)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := st.Watch(wctx, base, from)
	if err != nil {
		t.Fatalf("Watch(%q, %d): %v", base, from, err)
	}
	runWriters(half, per)

	var all []op
	for _, o := range opsBy {
		all = append(all, o...)
	}
	events := collect(t, w, len(all))
	checkEvents(t, events, all, from)
	t.Logf("%d writers, %d writes: %d events in order, revisions %d..%d", writers, len(all), len(events), events[0].KV.Revision, events[len(events)-1].KV.Revision)

	// Nothing more arrives (no duplicates at the tail): one more write is the very
	// next event.
	marker := base + "marker"
	mrev := mustCreate(t, st, marker, val("marker"))
	ev := collect(t, w, 1)[0]
	if ev.Type != datastore.Put || ev.KV.Key != marker || ev.KV.Revision != mrev {
		t.Fatalf("after the writes, the next event is %v %q rev %d, want the marker (rev %d)", ev.Type, ev.KV.Key, ev.KV.Revision, mrev)
	}
}

func (s *suite) testWatchDeleted(t *testing.T) {
	st, seg := s.store(t)
	ctx := ctxT(t)
	base := "blocks/" + seg + "/"
	key := base + "gone"
	rev := mustCreate(t, st, key, val("x"))
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := st.Watch(wctx, base, rev)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(ctx, key, rev); err != nil {
		t.Fatal(err)
	}
	ev := collect(t, w, 1)[0]
	if ev.Type != datastore.Deleted || ev.KV.Key != key || ev.KV.Revision <= rev {
		t.Fatalf("event %v %q rev %d, want Deleted %q with a revision above %d", ev.Type, ev.KV.Key, ev.KV.Revision, key, rev)
	}
	// The deletion's revision orders it before a re-create.
	rev2 := mustCreate(t, st, key, val("y"))
	ev2 := collect(t, w, 1)[0]
	if ev2.Type != datastore.Put || ev2.KV.Revision != rev2 || rev2 <= ev.KV.Revision {
		t.Fatalf("re-create: event %v rev %d (deletion at %d), want Put rev %d", ev2.Type, ev2.KV.Revision, ev.KV.Revision, rev2)
	}
}

func (s *suite) testWatchEndsWithContext(t *testing.T) {
	st, seg := s.store(t)
	ctx := ctxT(t)
	base := "blocks/" + seg + "/"
	_, from, err := st.List(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w, err := st.Watch(wctx, base, from)
	if err != nil {
		t.Fatal(err)
	}
	rev := mustCreate(t, st, base+"a", val("a"))
	if ev := collect(t, w, 1)[0]; ev.KV.Revision != rev {
		t.Fatalf("event rev %d, want %d", ev.KV.Revision, rev)
	}
	cancel()
	timer := time.NewTimer(Timeout)
	defer timer.Stop()
	for {
		select {
		case _, ok := <-w.Events():
			if ok {
				continue // an event racing the cancel is fine
			}
			if err := w.Err(); err != nil {
				t.Fatalf("watch ended by its context: Err %v, want nil", err)
			}
			return
		case <-timer.C:
			t.Fatalf("watch channel still open %v after its context ended", Timeout)
		}
	}
}

func (s *suite) testWatchCompacted(t *testing.T) {
	if s.opts.Compact == nil {
		if s.opts.NoCompact == "" {
			t.Fatal("Options.Compact is nil and Options.NoCompact gives no reason")
		}
		t.Skip("the implementation cannot compact: " + s.opts.NoCompact)
	}
	st, seg := s.store(t)
	ctx := ctxT(t)
	base := "blocks/" + seg + "/"
	rev1 := mustCreate(t, st, base+"a", val("1"))
	rev2, err := st.Update(ctx, base+"a", val("2"), rev1)
	if err != nil {
		t.Fatal(err)
	}
	rev3, err := st.Update(ctx, base+"a", val("3"), rev2)
	if err != nil {
		t.Fatal(err)
	}
	s.opts.Compact(t, rev3)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := st.Watch(wctx, base, rev1)
	if err == nil {
		// The error may come on the stream (etcd): the channel closes with it,
		// without delivering an event.
		timer := time.NewTimer(Timeout)
		defer timer.Stop()
		select {
		case ev, ok := <-w.Events():
			if ok {
				t.Fatalf("Watch from compacted revision %d delivered %v %q rev %d", rev1, ev.Type, ev.KV.Key, ev.KV.Revision)
			}
			err = w.Err()
		case <-timer.C:
			t.Fatalf("Watch from compacted revision %d neither failed nor closed within %v", rev1, Timeout)
		}
	}
	wantErr(t, fmt.Sprintf("Watch from revision %d compacted at %d", rev1, rev3), err, datastore.ErrCompacted)

	// Listing again and watching from the list's revision works.
	_, from, err := st.List(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	w, err = st.Watch(wctx, base, from)
	if err != nil {
		t.Fatal(err)
	}
	rev4, err := st.Update(ctx, base+"a", val("4"), rev3)
	if err != nil {
		t.Fatal(err)
	}
	if ev := collect(t, w, 1)[0]; ev.KV.Revision != rev4 {
		t.Fatalf("after re-listing: event rev %d, want %d", ev.KV.Revision, rev4)
	}
}

func (s *suite) testInvalid(t *testing.T) {
	st, seg := s.store(t)
	ctx := ctxT(t)
	good := "blocks/" + seg + "/ok"
	rev := mustCreate(t, st, good, val("ok"))

	long := strings.Repeat("a", datastore.MaxName+1)
	keys := []struct{ why, key string }{
		{"empty", ""},
		{"no name", "pools"},
		{"empty name", "pools/"},
		{"uppercase", "pools/Net1"},
		{"uppercase kind", "Pools/net1"},
		{"leading slash", "/pools/net1"},
		{"trailing slash", "blocks/net1/"},
		{"doubled slash", "blocks/net1//a"},
		{"underscore", "pools/net_1"},
		{"space", "pools/net 1"},
		{"colon (an unencoded address)", "blocks/net1/fd00::40"},
		{"name too long", "pools/" + long},
		{"two segments too long together", "blocks/" + long[:200] + "/" + long[:60]},
		{"reserved kind", datastore.LeaseKind + "/node-a"},
		{"non-ASCII", "pools/né"},
	}
	for _, k := range keys {
		t.Run(k.why, func(t *testing.T) {
			if _, err := st.Get(ctx, k.key); !errors.Is(err, datastore.ErrInvalid) {
				t.Errorf("Get(%q): %v, want ErrInvalid", k.key, err)
			}
			_, err := st.Create(ctx, k.key, val("x"))
			if !errors.Is(err, datastore.ErrInvalid) {
				t.Fatalf("Create(%q): %v, want ErrInvalid", k.key, err)
			}
			if k.key != "" && !strings.Contains(err.Error(), fmt.Sprintf("%q", k.key)) && !strings.Contains(err.Error(), k.key) {
				t.Errorf("Create(%q): error does not name the key: %v", k.key, err)
			}
			if _, err := st.Update(ctx, k.key, val("x"), rev); !errors.Is(err, datastore.ErrInvalid) {
				t.Errorf("Update(%q): %v, want ErrInvalid", k.key, err)
			}
			if err := st.Delete(ctx, k.key, rev); !errors.Is(err, datastore.ErrInvalid) {
				t.Errorf("Delete(%q): %v, want ErrInvalid", k.key, err)
			}
		})
	}
	// The longest name allowed is accepted.
	maxKey := "pools/" + seg + strings.Repeat("a", datastore.MaxName-len(seg))
	mrev := mustCreate(t, st, maxKey, val("max"))
	wantGet(t, st, maxKey, val("max"), mrev)
	if err := st.Delete(ctx, maxKey, mrev); err != nil {
		t.Fatal(err)
	}

	prefixes := []struct{ why, prefix string }{
		{"empty", ""},
		{"no slash", "blocks"},
		{"part of a segment", "blocks/" + seg[:3]},
		{"uppercase", "Blocks/"},
		{"doubled slash", "blocks//"},
		{"reserved kind", datastore.LeaseKind + "/"},
	}
	for _, p := range prefixes {
		t.Run("prefix "+p.why, func(t *testing.T) {
			if _, _, err := st.List(ctx, p.prefix); !errors.Is(err, datastore.ErrInvalid) {
				t.Errorf("List(%q): %v, want ErrInvalid", p.prefix, err)
			}
			if _, err := st.Watch(ctx, p.prefix, rev); !errors.Is(err, datastore.ErrInvalid) {
				t.Errorf("Watch(%q): %v, want ErrInvalid", p.prefix, err)
			}
		})
	}

	values := []struct {
		why   string
		value []byte
	}{
		{"oversized", jsonOfSize(datastore.MaxValue + 1)},
		{"not JSON", []byte("10.0.0.0/26")},
		{"a JSON array", []byte(`["a"]`)},
		{"a JSON string", []byte(`"a"`)},
		{"empty", nil},
		{"truncated JSON", []byte(`{"a":`)},
	}
	for _, v := range values {
		t.Run("value "+v.why, func(t *testing.T) {
			key := "blocks/" + seg + "/v"
			_, err := st.Create(ctx, key, v.value)
			if !errors.Is(err, datastore.ErrInvalid) {
				t.Fatalf("Create(%q, %s value): %v, want ErrInvalid", key, v.why, err)
			}
			if !strings.Contains(err.Error(), key) {
				t.Errorf("error for a %s value does not name the key %q: %v", v.why, key, err)
			}
			if _, err := st.Get(ctx, key); !errors.Is(err, datastore.ErrNotFound) {
				t.Errorf("a refused Create left the key: Get says %v", err)
			}
			_, err = st.Update(ctx, good, v.value, rev)
			if !errors.Is(err, datastore.ErrInvalid) || !strings.Contains(err.Error(), good) {
				t.Errorf("Update(%q, %s value): %v, want ErrInvalid naming the key", good, v.why, err)
			}
		})
	}
	wantGet(t, st, good, val("ok"), rev)
}

func (s *suite) testContextCanceled(t *testing.T) {
	st, seg := s.store(t)
	key := "blocks/" + seg + "/c"
	rev := mustCreate(t, st, key, val("c"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	canceled := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a canceled context: %v, want one wrapping context.Canceled", what, err)
		}
	}
	_, err := st.Get(ctx, key)
	canceled("Get", err)
	_, err = st.Create(ctx, "blocks/"+seg+"/new", val("n"))
	canceled("Create", err)
	_, err = st.Update(ctx, key, val("u"), rev)
	canceled("Update", err)
	canceled("Delete", st.Delete(ctx, key, rev))
	_, _, err = st.List(ctx, "blocks/"+seg+"/")
	canceled("List", err)
	if w, err := st.Watch(ctx, "blocks/"+seg+"/", rev); err != nil {
		canceled("Watch", err)
	} else {
		// A watch may start and end at once; its channel must close with Err nil.
		select {
		case _, ok := <-w.Events():
			if ok {
				t.Errorf("Watch with a canceled context delivered an event")
			} else if w.Err() != nil {
				t.Errorf("Watch with a canceled context: Err %v, want nil", w.Err())
			}
		case <-time.After(Timeout):
			t.Errorf("Watch with a canceled context still open after %v", Timeout)
		}
	}
	l := datastore.NodeLease{Node: seg, Holder: "h", TTL: s.opts.LeaseTTL, Revision: rev, ID: "1"}
	_, err = st.Leases().Acquire(ctx, seg, "h", s.opts.LeaseTTL)
	canceled("Leases.Acquire", err)
	_, err = st.Leases().Renew(ctx, l)
	canceled("Leases.Renew", err)
	canceled("Leases.Release", st.Leases().Release(ctx, l))
	_, err = st.Leases().List(ctx)
	canceled("Leases.List", err)

	// Nothing was applied.
	wantGet(t, st, key, val("c"), rev)
	if _, err := st.Get(ctxT(t), "blocks/"+seg+"/new"); !errors.Is(err, datastore.ErrNotFound) {
		t.Errorf("a Create with a canceled context was applied: Get says %v", err)
	}
	if ls := leasesOf(t, st, seg); len(ls) != 0 {
		t.Errorf("an Acquire with a canceled context was applied: %+v", ls)
	}
}

func (s *suite) testUnavailable(t *testing.T) {
	if s.opts.Stop == nil {
		if s.opts.NoStop == "" {
			t.Fatal("Options.Stop is nil and Options.NoStop gives no reason")
		}
		t.Skip("the server cannot be stopped here: " + s.opts.NoStop)
	}
	st, seg := s.store(t)
	ctx := ctxT(t)
	base := "blocks/" + seg + "/"
	key := base + "survivor"
	rev := mustCreate(t, st, key, val("before"))
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := st.Watch(wctx, base, rev)
	if err != nil {
		t.Fatal(err)
	}

	start := s.opts.Stop(t)
	started := false
	defer func() {
		if !started {
			start()
		}
	}()
	short := func() context.Context {
		c, cancel := context.WithTimeout(ctx, DownTimeout())
		t.Cleanup(cancel)
		return c
	}
	_, err = st.Get(short(), key)
	wantErr(t, "Get with the server down", err, datastore.ErrUnavailable)
	_, err = st.Update(short(), key, val("while down"), rev)
	wantErr(t, "Update with the server down", err, datastore.ErrUnavailable)
	_, _, err = st.List(short(), base)
	wantErr(t, "List with the server down", err, datastore.ErrUnavailable)

	start()
	started = true
	// The store recovers by itself (the caller retries; no reopen).
	var kv datastore.KV
	deadline := time.Now().Add(Timeout)
	for {
		kv, err = st.Get(short(), key)
		if err == nil {
			break
		}
		if !errors.Is(err, datastore.ErrUnavailable) {
			t.Fatalf("Get while the server restarts: %v, want nil or ErrUnavailable", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("store still unavailable %v after the server restarted: %v", Timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The Update sent while down may or may not have been applied: re-read decides.
	if kv.Revision != rev && !sameJSON(kv.Value, val("while down")) {
		t.Fatalf("after restart: %q rev %d %s; want rev %d or the value written while down", key, kv.Revision, kv.Value, rev)
	}
	rev2, err := st.Update(ctx, key, val("after"), kv.Revision)
	if err != nil {
		t.Fatalf("Update after restart: %v", err)
	}
	// The watch either delivers (resumed) or has ended with ErrUnavailable or
	// ErrCompacted; it never skips a change silently.
	timer := time.NewTimer(Timeout)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				if err := w.Err(); !errors.Is(err, datastore.ErrUnavailable) && !errors.Is(err, datastore.ErrCompacted) {
					t.Fatalf("watch across the restart ended with Err %v, want ErrUnavailable or ErrCompacted", err)
				}
				t.Logf("watch ended across the restart: %v", w.Err())
				return
			}
			if ev.KV.Revision == rev2 {
				t.Logf("watch resumed across the restart")
				return
			}
			if ev.KV.Key != key || ev.KV.Revision <= rev || ev.KV.Revision > rev2 {
				t.Fatalf("watch across the restart delivered %v %q rev %d", ev.Type, ev.KV.Key, ev.KV.Revision)
			}
		case <-timer.C:
			t.Fatalf("watch across the restart neither delivered rev %d nor ended within %v", rev2, Timeout)
		}
	}
}

// leasesOf returns the listed leases of node.
func leasesOf(t *testing.T, st datastore.Store, node string) []datastore.NodeLease {
	t.Helper()
	ls, err := st.Leases().List(ctxT(t))
	if err != nil {
		t.Fatalf("Leases.List: %v", err)
	}
	for i := 1; i < len(ls); i++ {
		if ls[i-1].Node >= ls[i].Node {
			t.Fatalf("Leases.List not in strict node order: %q then %q", ls[i-1].Node, ls[i].Node)
		}
	}
	var out []datastore.NodeLease
	for _, l := range ls {
		if l.Node == node {
			out = append(out, l)
		}
	}
	return out
}

// wantListed checks that node's listed lease is l (holder, TTL, revision, ID,
// addresses).
func wantListed(t *testing.T, st datastore.Store, l datastore.NodeLease) {
	t.Helper()
	ls := leasesOf(t, st, l.Node)
	if len(ls) != 1 {
		t.Fatalf("Leases.List has %d leases of node %q, want 1: %+v", len(ls), l.Node, ls)
	}
	if !reflect.DeepEqual(ls[0], l) {
		t.Fatalf("Leases.List: %+v, want %+v", ls[0], l)
	}
}

// leaseStore opens a store and releases whatever lease of node is left at the end.
func (s *suite) leaseStore(t *testing.T) (datastore.Store, string) {
	st, node := s.store(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), Timeout)
		defer cancel()
		ls, err := st.Leases().List(ctx)
		if err != nil {
			t.Errorf("cleanup: Leases.List: %v", err)
			return
		}
		for _, l := range ls {
			if l.Node == node {
				if err := st.Leases().Release(ctx, l); err != nil {
					t.Errorf("cleanup: Release %+v: %v", l, err)
				}
			}
		}
	})
	return st, node
}

func (s *suite) testLeaseLifecycle(t *testing.T) {
	st, node := s.leaseStore(t)
	ctx := ctxT(t)
	ttl := s.opts.LeaseTTL
	if ls := leasesOf(t, st, node); len(ls) != 0 {
		t.Fatalf("a fresh node has leases: %+v", ls)
	}
	l, err := st.Leases().Acquire(ctx, node, "holder-a", ttl)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if l.Node != node || l.Holder != "holder-a" || l.TTL != ttl || l.Revision <= 0 || l.ID == "" {
		t.Fatalf("Acquire returned %+v; want node %q, holder-a, TTL %v, a revision and an ID", l, node, ttl)
	}
	wantListed(t, st, l)

	// Every Renew moves the revision (observers judge liveness by it) and List
	// shows the new one.
	prev := l
	for i := range 3 {
		l2, err := st.Leases().Renew(ctx, prev)
		if err != nil {
			t.Fatalf("Renew %d: %v", i, err)
		}
		if l2.Revision <= prev.Revision {
			t.Fatalf("Renew %d: revision %d, not above %d: an observer would judge the lease dead", i, l2.Revision, prev.Revision)
		}
		if l2.Node != node || l2.Holder != "holder-a" || l2.TTL != ttl || l2.ID != l.ID {
			t.Fatalf("Renew %d returned %+v, want the same node, holder, TTL and ID as %+v", i, l2, l)
		}
		wantListed(t, st, l2)
		prev = l2
	}
	// Renewing from a stale copy (our own older one) is a conflict.
	_, err = st.Leases().Renew(ctx, l)
	wantErr(t, "Renew from a stale NodeLease", err, datastore.ErrConflict)
	wantErr(t, "Release from a stale NodeLease", st.Leases().Release(ctx, l), datastore.ErrConflict)
	wantListed(t, st, prev)

	if err := st.Leases().Release(ctx, prev); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if ls := leasesOf(t, st, node); len(ls) != 0 {
		t.Fatalf("Leases.List after Release: %+v", ls)
	}
	_, err = st.Leases().Renew(ctx, prev)
	wantErr(t, "Renew of a released lease", err, datastore.ErrNotFound)
	wantErr(t, "Release of a released lease", st.Leases().Release(ctx, prev), datastore.ErrNotFound)

	// Acquire again after a release: a new lease.
	l3, err := st.Leases().Acquire(ctx, node, "holder-b", ttl)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	if l3.Revision <= prev.Revision || l3.Holder != "holder-b" {
		t.Fatalf("Acquire after Release: %+v, want holder-b and a revision above %d", l3, prev.Revision)
	}
	wantListed(t, st, l3)
}

func (s *suite) testLeaseTakeover(t *testing.T) {
	st, node := s.leaseStore(t)
	ctx := ctxT(t)
	ttl := s.opts.LeaseTTL
	a, err := st.Leases().Acquire(ctx, node, "holder-a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	// A second store (another agent) takes the node's lease over.
	other := s.open(t)
	t.Cleanup(func() { other.Close() })
	b, err := other.Leases().Acquire(ctx, node, "holder-b", ttl)
	if err != nil {
		t.Fatalf("Acquire over another holder's lease: %v", err)
	}
	if b.Revision <= a.Revision || b.Holder != "holder-b" {
		t.Fatalf("takeover returned %+v, want holder-b and a revision above %d", b, a.Revision)
	}
	_, err = st.Leases().Renew(ctx, a)
	wantErr(t, "Renew by the holder that lost the lease", err, datastore.ErrConflict)
	wantErr(t, "Release by the holder that lost the lease", st.Leases().Release(ctx, a), datastore.ErrConflict)
	wantListed(t, st, b)
	b2, err := other.Leases().Renew(ctx, b)
	if err != nil {
		t.Fatalf("Renew by the new holder: %v", err)
	}
	wantListed(t, st, b2)
}

func (s *suite) testLeaseRacingRenews(t *testing.T) {
	st, node := s.leaseStore(t)
	ctx := ctxT(t)
	l, err := st.Leases().Acquire(ctx, node, "holder-a", s.opts.LeaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]datastore.NodeLease, racers)
	errs := race(func(i int) error {
		var err error
		got[i], err = st.Leases().Renew(ctx, l)
		return err
	})
	w := oneWinner(t, fmt.Sprintf("%d Renews of one NodeLease", racers), errs, datastore.ErrConflict)
	wantListed(t, st, got[w])
}

func (s *suite) testLeaseExpiry(t *testing.T) {
	if s.opts.NoExpiry != "" {
		t.Skip("the server does not expire leases: " + s.opts.NoExpiry)
	}
	st, node := s.leaseStore(t)
	ctx := ctxT(t)
	ttl := s.opts.LeaseTTL
	l, err := st.Leases().Acquire(ctx, node, "holder-a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	l, err = st.Leases().Renew(ctx, l) // a renewed lease expires as well
	if err != nil {
		t.Fatal(err)
	}
	// Not renewed, the lease disappears (wait, not a timing assertion: the
	// contract's lower bound on expiry cannot be checked from here).
	deadline := time.Now().Add(Timeout + 10*ttl)
	for len(leasesOf(t, st, node)) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("an unrenewed lease with TTL %v is still listed after %v", ttl, Timeout+10*ttl)
		}
		time.Sleep(ttl / 4)
	}
	_, err = st.Leases().Renew(ctx, l)
	wantErr(t, "Renew after expiry", err, datastore.ErrNotFound)
	// The node can be leased again.
	if _, err := st.Leases().Acquire(ctx, node, "holder-b", ttl); err != nil {
		t.Fatalf("Acquire after expiry: %v", err)
	}
}

func (s *suite) testLeaseInvalid(t *testing.T) {
	st, node := s.leaseStore(t)
	ctx := ctxT(t)
	ttl := s.opts.LeaseTTL
	cases := []struct {
		why, node, holder string
		ttl               time.Duration
	}{
		{"empty node", "", "h", ttl},
		{"uppercase node", "Node-A", "h", ttl},
		{"slash in node", "a/b", "h", ttl},
		{"node too long", strings.Repeat("n", datastore.MaxName+1), "h", ttl},
		{"empty holder", node, "", ttl},
		{"space in holder", node, "a b", ttl},
		{"zero ttl", node, "h", 0},
		{"negative ttl", node, "h", -time.Second},
		{"sub-second ttl", node, "h", 500 * time.Millisecond},
		{"fractional ttl", node, "h", 1500 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.why, func(t *testing.T) {
			_, err := st.Leases().Acquire(ctx, c.node, c.holder, c.ttl)
			wantErr(t, fmt.Sprintf("Acquire(%q, %q, %v)", c.node, c.holder, c.ttl), err, datastore.ErrInvalid)
		})
	}
	if ls := leasesOf(t, st, node); len(ls) != 0 {
		t.Fatalf("a refused Acquire left a lease: %+v", ls)
	}
	_, err := st.Leases().Renew(ctx, datastore.NodeLease{Node: "Bad", Holder: "h", TTL: ttl, Revision: 1, ID: "1"})
	wantErr(t, "Renew of a lease with a bad node name", err, datastore.ErrInvalid)
}

// testLeaseAddrs: the addresses published with Acquire are listed and kept by every
// Renew; a takeover without addresses drops them; bad addresses are refused.
func (s *suite) testLeaseAddrs(t *testing.T) {
	st, node := s.leaseStore(t)
	ctx := ctxT(t)
	ttl := s.opts.LeaseTTL
	want := []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")}
	l, err := st.Leases().Acquire(ctx, node, "holder-a", ttl, want...)
	if err != nil {
		t.Fatalf("Acquire with addresses: %v", err)
	}
	if !reflect.DeepEqual(l.Addrs, want) {
		t.Fatalf("Acquire returned addresses %v, want %v", l.Addrs, want)
	}
	wantListed(t, st, l)
	for i := range 2 {
		if l, err = st.Leases().Renew(ctx, l); err != nil {
			t.Fatalf("Renew %d: %v", i, err)
		}
		if !reflect.DeepEqual(l.Addrs, want) {
			t.Fatalf("Renew %d returned addresses %v, want %v", i, l.Addrs, want)
		}
		wantListed(t, st, l)
	}
	// another agent of the node that publishes none (an older release)
	b, err := st.Leases().Acquire(ctx, node, "holder-b", ttl)
	if err != nil {
		t.Fatalf("Acquire without addresses: %v", err)
	}
	if len(b.Addrs) != 0 {
		t.Fatalf("Acquire without addresses returned %v", b.Addrs)
	}
	wantListed(t, st, b)
	for _, bad := range [][]netip.Addr{
		{{}},
		{netip.IPv4Unspecified()},
		{netip.MustParseAddr("fe80::1%eth0")},
		{netip.MustParseAddr("224.0.0.1")},
		make([]netip.Addr, datastore.MaxAddrs+1),
	} {
		_, err := st.Leases().Acquire(ctx, node, "holder-c", ttl, bad...)
		wantErr(t, fmt.Sprintf("Acquire with addresses %v", bad), err, datastore.ErrInvalid)
	}
	wantListed(t, st, b)
}
