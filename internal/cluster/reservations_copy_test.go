package cluster_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/datastore/memds"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
)

// copyWait bounds each wait for the copy to see a change (a wait, not an
// assertion of speed).
const copyWait = time.Minute

// waitCopy waits until cond holds of the copy, checked after every change it
// reports (and once at first).
func waitCopy(t *testing.T, rs *cluster.Reservations, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(copyWait)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-rs.Changed():
		case <-deadline.C:
			t.Fatalf("the copy of the IPReservations never %s", what)
		}
	}
}

func names(rs []cluster.Reservation) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Name)
	}
	return out
}

// runCopy starts a copy of ds's reservations, stopped at the end of t.
func runCopy(t *testing.T, ds datastore.Store) *cluster.Reservations {
	rs := cluster.NewReservations(ds, ledgertest.TestLogger(t))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { rs.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return rs
}

// The watched copy of the IPReservations: unknown until it has listed, then
// every reservation created before it started and since, changed and deleted,
// on every datastore; a spec that does not parse is listed with the entries
// that did, and reported with the field.
func TestReservationsCopy(t *testing.T) { forBackends(t, testReservationsCopy) }

func testReservationsCopy(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	ctx := context.Background()
	if _, err := c.ds.Create(ctx, cluster.ReservationKey("gw"), []byte(`{"addresses":["10.0.0.2","fd00::/120"],"reason":"routers"}`)); err != nil {
		t.Fatal(err)
	}
	rs := cluster.NewReservations(c.open(), ledgertest.TestLogger(t))
	if _, err := rs.Current(); !errors.Is(err, cluster.ErrReservationsUnknown) || !strings.Contains(err.Error(), "not listed yet") {
		t.Fatalf("before it listed: %v, want ErrReservationsUnknown naming why", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { rs.Run(rctx) })
	defer wg.Wait()
	defer cancel()
	waitCopy(t, rs, "listed", func() bool { _, err := rs.Current(); return err == nil })
	cur, _ := rs.Current()
	if len(cur) != 1 || cur[0].Name != "gw" || !slices.Equal(cur[0].Prefixes, prefixes("10.0.0.2/32", "fd00::/120")) || cur[0].Reason != "routers" {
		t.Fatalf("listed %+v, want gw", cur)
	}
	rev, err := c.ds.Create(ctx, cluster.ReservationKey("lab"), []byte(`{"addresses":["10.0.1.0/24","10.0.2.300"]}`))
	if err != nil {
		t.Fatal(err)
	}
	waitCopy(t, rs, "saw lab created", func() bool { cur, _ := rs.Current(); return slices.Equal(names(cur), []string{"gw", "lab"}) })
	cur, _ = rs.Current()
	if !slices.Equal(cur[1].Prefixes, prefixes("10.0.1.0/24")) {
		t.Fatalf("lab read as %+v, want the entry that parses", cur[1])
	}
	if bad := rs.Invalid(); len(bad) != 1 || !strings.Contains(bad[0].Error(), "IPReservation lab: spec.addresses[1]") {
		t.Fatalf("Invalid() = %v, want lab's spec.addresses[1]", bad)
	}
	if _, err := c.ds.Update(ctx, cluster.ReservationKey("lab"), []byte(`{"addresses":["10.0.1.0/24","10.0.2.3"]}`), rev); err != nil {
		t.Fatal(err)
	}
	waitCopy(t, rs, "saw lab fixed", func() bool { return len(rs.Invalid()) == 0 })
	kv, err := c.ds.Get(ctx, cluster.ReservationKey("gw"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ds.Delete(ctx, kv.Key, kv.Revision); err != nil {
		t.Fatal(err)
	}
	waitCopy(t, rs, "saw gw deleted", func() bool { cur, _ := rs.Current(); return slices.Equal(names(cur), []string{"lab"}) })
}

// A broken watch makes the copy unknown (ErrReservationsUnknown naming the
// cause) until it has listed again: while the datastore is down nothing it
// says counts, and a reservation made meanwhile is there once it is back.
func TestReservationsCopyWatchBroken(t *testing.T) {
	ds := memds.New(clocktest.New())
	rs := runCopy(t, ds.Open())
	waitCopy(t, rs, "listed", func() bool { _, err := rs.Current(); return err == nil })
	ds.SetAvailable(false)
	waitCopy(t, rs, "became unknown", func() bool { _, err := rs.Current(); return err != nil })
	if _, err := rs.Current(); !errors.Is(err, cluster.ErrReservationsUnknown) || !strings.Contains(err.Error(), "unavailable") {
		t.Fatalf("with its watch broken: %v, want ErrReservationsUnknown naming the cause", err)
	}
	ds.SetAvailable(true)
	if _, err := ds.Create(context.Background(), cluster.ReservationKey("late"), []byte(`{"addresses":["10.0.0.9"]}`)); err != nil {
		t.Fatal(err)
	}
	waitCopy(t, rs, "listed again", func() bool { cur, err := rs.Current(); return err == nil && slices.Equal(names(cur), []string{"late"}) })
}

// After a break, Kick (an ADD waiting) makes the copy list again once the
// datastore is back, without waiting out its backoff: with a first pause of an
// hour, Live closes again only through the kick. test/cluster's
// TestChaosKubernetes failed on this in make test: after an apiserver restart a
// node's copy stayed unknown, its backoff grown, and an ADD was refused.
func TestReservationsCopyKicked(t *testing.T) {
	ds := memds.New(clocktest.New())
	rs := cluster.NewReservations(ds.Open(), ledgertest.TestLogger(t))
	cluster.SetReservationsPause(rs, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { rs.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	waitLive := func(live <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-live:
		case <-time.After(copyWait):
			t.Fatalf("the copy of the IPReservations was not live %s", what)
		}
	}
	waitLive(rs.Live(), "after its first list")
	ds.SetAvailable(false)
	waitCopy(t, rs, "became unknown", func() bool { _, err := rs.Current(); return err != nil })
	live := rs.Live()
	select {
	case <-live:
		t.Fatal("Live is closed while the copy's watch is broken")
	default:
	}
	ds.SetAvailable(true)
	rs.Kick()
	waitLive(live, "again after Kick, with the datastore back (its pause is an hour)")
	if _, err := rs.Current(); err != nil {
		t.Fatalf("live again, yet Current: %v", err)
	}
}
