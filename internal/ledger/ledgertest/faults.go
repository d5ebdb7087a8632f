package ledgertest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/store/faultstore"
)

// SameAsStore fails t unless l's view of the books (leases, pool counters and free
// addresses) equals that of a ledger freshly opened on st, the state l keeps.
func SameAsStore(t testing.TB, l *ledger.Ledger, st ledger.Store, opts ledger.Options) {
	t.Helper()
	if err := sameAsStore(l, st, opts); err != nil {
		t.Fatal(err)
	}
}

func sameAsStore(l *ledger.Ledger, st ledger.Store, opts ledger.Options) error {
	opts.Logger = nil
	fresh, err := ledger.Open(st, opts)
	if err != nil {
		return fmt.Errorf("fresh open of the same store: %v", err)
	}
	if got, want := fmt.Sprint(l.Leases("")), fmt.Sprint(fresh.Leases("")); got != want {
		return fmt.Errorf("memory differs from the store:\n memory %s\n  store %s", got, want)
	}
	// Available is left out: a fresh open counts every free address as released at
	// the open (the reuse delay restarts), the running ledger knows better.
	pools := func(l *ledger.Ledger) string {
		ps := l.Pools()
		for i := range ps {
			ps[i].Available = false
		}
		return fmt.Sprint(ps)
	}
	if got, want := pools(l), pools(fresh); got != want {
		return fmt.Errorf("pools in memory differ from the store:\n memory %s\n  store %s", got, want)
	}
	// blocks of cluster-scoped pools (the allocation count is memory only; the fresh
	// cursor a fresh open derives may be behind the running ledger's when it skipped
	// a gateway: compared by the audit)
	blocks := func(l *ledger.Ledger) string {
		bs := l.Blocks("")
		for i := range bs {
			bs[i].Allocations = 0
			bs[i].NextFresh = 0
		}
		return fmt.Sprint(bs)
	}
	if got, want := blocks(l), blocks(fresh); got != want {
		return fmt.Errorf("blocks in memory differ from the store:\n memory %s\n  store %s", got, want)
	}
	return nil
}

// testRollbackReleaseAndReuse: one commit that releases an address and hands the same
// address out again (a supersede ADD giving the pod its old address back; a DEL and an
// ADD of the same pod UID in one group commit) fails at every step of the commit. The
// ledger must not panic, must answer the error, and must afterwards agree with what is
// stored; the operations then succeed when retried.
func testRollbackReleaseAndReuse(t *testing.T, newStore Factory) {
	for _, step := range faultstore.Steps() {
		for _, shape := range []string{"supersede", "del+add"} {
			t.Run(shape+"/"+step.String(), func(t *testing.T) {
				inner, _ := newStore(t)
				st := faultstore.New(inner, nil)
				clk := NewClock()
				opts := ledger.Options{Clock: clk, ReuseDelay: time.Hour}
				l := Open(t, st, opts)
				r := Ranges(t, `[[{"subnet":"10.9.0.0/24"}],[{"subnet":"fd00::/120"}]]`)
				pod := ledger.Pod{Namespace: "ns", Name: "crashy", UID: "u1"}
				old, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("sb1"), Pod: pod, Ranges: r})
				if err != nil {
					t.Fatal(err)
				}
				var addErr, delErr error
				switch shape {
				case "supersede":
					st.FailNext(step)
					_, _, addErr = l.Allocate(ledger.AllocateRequest{Key: Key("sb2"), Pod: pod, Ranges: r, Supersede: []ledger.Key{Key("sb1")}})
				case "del+add":
					// queue the DEL and the ADD behind a held commit so that they
					// share the next one, and fail that one
					entered, release := st.Hold()
					leadDone := make(chan error)
					go func() {
						_, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("lead"), Pod: ledger.Pod{UID: "u9"}, Ranges: r})
						leadDone <- err
					}()
					<-entered
					n := 0
					st.SetChooser(func() faultstore.Step {
						n++
						if n == 2 {
							return step
						}
						return faultstore.None
					})
					delDone, addDone := make(chan error), make(chan error)
					go func() { _, _, err := l.Release(Key("sb1"), ledger.ReasonDEL, ""); delDone <- err }()
					time.Sleep(50 * time.Millisecond)
					go func() {
						_, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("sb2"), Pod: pod, Ranges: r})
						addDone <- err
					}()
					time.Sleep(50 * time.Millisecond)
					release()
					if err := <-leadDone; err != nil {
						t.Fatalf("lead: %v", err)
					}
					delErr, addErr = <-delDone, <-addDone
				}
				if addErr == nil || !errors.Is(addErr, ledger.ErrStore) {
					t.Fatalf("ADD in the failed commit: err = %v, want ErrStore", addErr)
				}
				t.Logf("ADD: %v; DEL: %v", addErr, delErr)
				Audit(t, l)
				SameAsStore(t, l, st.Inner(), opts)
				// retried, they succeed, and the pod keeps its address
				if _, _, err := l.Release(Key("sb1"), ledger.ReasonDEL, ""); err != nil {
					t.Fatal(err)
				}
				nw, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("sb2"), Pod: pod, Ranges: r, Supersede: []ledger.Key{Key("sb1")}})
				if err != nil || fmt.Sprint(nw.IPs) != fmt.Sprint(old.IPs) {
					t.Fatalf("retried ADD got %v (%v), want the pod's address %v", nw.IPs, err, old.IPs)
				}
				SameAsStore(t, l, st.Inner(), opts)
			})
		}
	}
}
