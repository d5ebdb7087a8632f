package ledgertest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/store/faultstore"
	"github.com/ipledger/ipledger/internal/testenv"
)

// SoakConfig sizes a fault-injection soak.
type SoakConfig struct {
	Ops       int     // operations in all; a tenth of them under -short
	Workers   int     // concurrent callers
	FaultRate float64 // share of commits that fail, at a random step
	Seed      uint64
}

// Soak runs random operations (allocate, allocate superseding the pod's other lease,
// release, conditional releases) from concurrent callers against a ledger whose store
// fails random commits at random steps (faultstore). After every operation, with no
// other operation in flight, it checks: the audit balances and finds no address held
// twice; the ledger's memory equals a ledger freshly opened on the same store; and
// the caller's own attachments are as its answers said (an acknowledged lease is
// there; a successful release is gone; a failed call may or may not have happened).
// A panic anywhere fails the test binary. It logs its figures.
func Soak(t *testing.T, inner ledger.Store, cfg SoakConfig) {
	rng := rand.New(rand.NewPCG(cfg.Seed, 11))
	st := faultstore.New(inner, func() faultstore.Step {
		// called under the fault store's lock: rng is used by one goroutine at a time
		if rng.Float64() >= cfg.FaultRate {
			return faultstore.None
		}
		steps := faultstore.Steps()
		return steps[rng.IntN(len(steps))]
	})
	clk := NewClock()
	opts := ledger.Options{Clock: clk, ReuseDelay: time.Second, HistoryKeep: 2}
	l, err := ledger.Open(st, opts)
	if err != nil {
		t.Fatal(err)
	}
	ranges := map[string]string{
		"net":   `[[{"subnet":"10.9.0.0/28"}],[{"subnet":"fd00:9::/124"}]]`,
		"other": `[[{"subnet":"10.10.0.0/29"}]]`,
	}
	networks := []string{"net", "other"}
	parsed := map[string][]pool.RangeSet{}
	for n, js := range ranges {
		parsed[n] = Ranges(t, js)
	}

	var check sync.RWMutex // operations share it; each check holds it alone
	var mu sync.Mutex      // guards the figures
	kinds := map[string]int{}
	outcomes := map[string]int{}
	start := time.Now()
	size := testenv.Size(cfg.Ops, max(cfg.Workers, cfg.Ops/10)) // the fast tier: the same mix, fewer rounds
	perWorker := size / cfg.Workers
	var wg sync.WaitGroup
	for w := 0; w < cfg.Workers; w++ {
		wg.Go(func() {
			wr := rand.New(rand.NewPCG(cfg.Seed, uint64(w)))
			key := func() ledger.Key {
				return ledger.Key{Network: networks[wr.IntN(len(networks))], ContainerID: fmt.Sprintf("w%d-c%d", w, wr.IntN(3)), IfName: "eth0"}
			}
			pod := func() ledger.Pod {
				return ledger.Pod{Namespace: "ns", Name: "p", UID: fmt.Sprintf("w%d-u%d", w, wr.IntN(2))}
			}
			for i := 0; i < perWorker; i++ {
				if t.Failed() {
					return
				}
				k := key()
				var kind string
				var err error
				var got ledger.Lease
				var gotOK bool
				check.RLock()
				clk.Advance(50 * time.Millisecond)
				switch op := wr.IntN(10); {
				case op < 4:
					kind = "allocate"
					got, _, err = l.Allocate(ledger.AllocateRequest{Key: k, Pod: pod(), Ranges: parsed[k.Network]})
					gotOK = err == nil
				case op < 6:
					kind = "supersede"
					p := pod()
					req := ledger.AllocateRequest{Key: k, Pod: p, Ranges: parsed[k.Network]}
					for _, old := range l.LeasesOfPod(k.Network, p.UID) {
						if wr.IntN(2) == 0 {
							req.Supersede = append(req.Supersede, old.Key)
						} else {
							req.SupersedeHolders = append(req.SupersedeHolders, ledger.HolderOf(old))
						}
					}
					got, _, err = l.Allocate(req)
					gotOK = err == nil
				case op < 8:
					kind = "release"
					_, _, err = l.Release(k, ledger.ReasonDEL, "soak")
				case op < 9:
					kind = "release-if-created"
					created := clk.Now()
					if ls, ok := l.Lease(k); ok && wr.IntN(3) > 0 {
						created = ls.Created
					}
					_, _, err = l.ReleaseIfCreated(k, created, ledger.ReasonGC, "soak")
				default:
					kind = "release-created-before"
					_, _, err = l.ReleaseCreatedBefore(k, clk.Now(), ledger.ReasonDEL, "soak")
				}
				check.RUnlock()
				outcome := "ok"
				switch {
				case err == nil:
				case errors.Is(err, faultstore.ErrInjected):
					outcome = "injected fault"
				case errors.Is(err, ledger.ErrPoolExhausted):
					outcome = "exhausted"
				default:
					t.Errorf("%s %s: unexpected error %v", kind, k, err)
					return
				}
				check.Lock()
				cerr := soakCheck(l, st.Inner(), opts, k, kind, err, got, gotOK)
				check.Unlock()
				if cerr != nil {
					t.Error(cerr)
					return
				}
				mu.Lock()
				kinds[kind]++
				outcomes[outcome]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	commits, faults := st.Counts()
	rep := Audit(t, l)
	ops := 0
	for _, n := range kinds {
		ops += n
	}
	t.Logf("soak: %d operations by %d callers in %v (%.0f ops/s, each followed by audit + fresh-open comparison)", ops, cfg.Workers, took.Round(time.Millisecond), float64(ops)/took.Seconds())
	t.Logf("soak: operations %v; outcomes %v", kinds, outcomes)
	t.Logf("soak: %d commits, faults injected: before-write %d, during-write %d, after-write %d, after-sync %d; %d live leases at the end",
		commits, faults[faultstore.BeforeWrite], faults[faultstore.DuringWrite], faults[faultstore.AfterWrite], faults[faultstore.AfterSync], rep.Live)
	for _, step := range faultstore.Steps() {
		if cfg.FaultRate > 0 && faults[step] == 0 {
			t.Errorf("soak: no %s fault injected in %d commits: too few operations to meet every fault", step, commits)
		}
	}
	if l.Broken() != nil {
		t.Fatalf("ledger broken: %v", l.Broken())
	}
}

// soakCheck runs the invariants after one operation, alone.
func soakCheck(l *ledger.Ledger, inner ledger.Store, opts ledger.Options, k ledger.Key, kind string, err error, got ledger.Lease, gotOK bool) error {
	rep, aerr := l.Audit()
	if aerr != nil {
		return fmt.Errorf("after %s %s: audit: %v", kind, k, aerr)
	}
	if !rep.OK {
		return fmt.Errorf("after %s %s (%v): audit: problems %v, double assigned %v", kind, k, err, rep.Problems, rep.DoubleAssigned)
	}
	if err := sameAsStore(l, inner, opts); err != nil {
		return fmt.Errorf("after %s %s (%v): %v", kind, k, err, err)
	}
	ls, held := l.Lease(k)
	switch {
	case gotOK && (!held || fmt.Sprint(ls.IPs) != fmt.Sprint(got.IPs)):
		return fmt.Errorf("after %s %s acknowledged %v: ledger holds %v (%v)", kind, k, got.IPs, ls.IPs, held)
	case err == nil && kind == "release" && held:
		return fmt.Errorf("after a successful release of %s it still holds %v", k, ls.IPs)
	}
	return nil
}
