package memds_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/datastore/datastoretest"
	"github.com/ipledger/ipledger/internal/datastore/memds"
)

func TestConformance(t *testing.T) {
	shared := memds.New(clock.NewSystem())
	datastoretest.Run(t, func(t *testing.T) datastore.Store { return shared.Open() }, datastoretest.Options{
		Compact: func(t *testing.T, rev int64) { shared.Compact(rev) },
		Stop: func(t *testing.T) func() {
			shared.SetAvailable(false)
			return func() { shared.SetAvailable(true) }
		},
		LeaseTTL: time.Second,
	})
}

// TestLeaseExpiresOnTheGivenClock: leases expire on the monotonic clock the store is
// given, so tests of fencing can move time instead of sleeping.
func TestLeaseExpiresOnTheGivenClock(t *testing.T) {
	clk := clocktest.New()
	s := memds.New(clk)
	ctx := context.Background()
	l, err := s.Leases().Acquire(ctx, "node-a", "agent-1", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Second) // exactly TTL: not yet expired
	if l, err = s.Leases().Renew(ctx, l); err != nil {
		t.Fatalf("Renew at TTL: %v", err)
	}
	clk.Step(time.Hour) // a wall-clock step changes nothing
	if ls, _ := s.Leases().List(ctx); len(ls) != 1 {
		t.Fatalf("lease gone after a wall-clock step: %+v", ls)
	}
	clk.Advance(10*time.Second + time.Nanosecond)
	if ls, _ := s.Leases().List(ctx); len(ls) != 0 {
		t.Fatalf("lease listed past its TTL: %+v", ls)
	}
	if _, err := s.Leases().Renew(ctx, l); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("Renew past TTL: %v, want ErrNotFound", err)
	}
}

// TestClosedClientLeavesOthers: closing one client ends its watches and calls, not
// those of other clients of the same store.
func TestClosedClientLeavesOthers(t *testing.T) {
	a := memds.New(clock.NewSystem())
	b := a.Open()
	ctx := context.Background()
	w, err := b.Watch(ctx, "pools/", 0)
	if err != nil {
		t.Fatal(err)
	}
	wa, err := a.Watch(ctx, "pools/", 0)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if _, ok := <-w.Events(); ok || !errors.Is(w.Err(), datastore.ErrUnavailable) {
		t.Fatalf("watch of a closed client: open or Err %v", w.Err())
	}
	if _, err := b.Get(ctx, "pools/x"); !errors.Is(err, datastore.ErrUnavailable) {
		t.Fatalf("Get on a closed client: %v", err)
	}
	rev, err := a.Create(ctx, "pools/x", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-wa.Events(); ev.KV.Revision != rev {
		t.Fatalf("other client's watch: %+v, want rev %d", ev, rev)
	}
}
