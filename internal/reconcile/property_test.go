package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/store/memstore"
	"github.com/ipledger/ipledger/internal/testenv"
)

// TestPropertyNeverReleaseReady drives random interleavings of ADD (some
// superseding an older sandbox of the same pod), DEL, sandbox state changes,
// namespace changes, listing errors, empty and partial listings, status errors,
// time and reconciliation rounds, with an API witness whose answers are random (a
// pod deleted, finished or running whatever its sandboxes do, a watch not synced),
// and checks after every step that no lease was
// released by the reconciler, supersession or GC while its sandbox was READY, and
// that the books balance.
func TestPropertyNeverReleaseReady(t *testing.T) {
	seeds := testenv.Size(120, 20)
	nsStates := []NSState{NSGone, NSAddrAbsent, NSAddrPresent, NSUnknown}
	var releasedByRec, rounds int
	for seed := 0; seed < seeds; seed++ {
		rng := rand.New(rand.NewPCG(uint64(seed), 7))
		clk := clocktest.New()
		l, err := ledger.Open(memstore.New(), ledger.Options{Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		rt := newFakeRuntime()
		ns := &fakeNetns{st: map[string]NSState{}}
		api := newFakeAPI()
		r, err := New(Options{Ledger: l, Runtime: rt, Netns: ns, API: api, Interval: interval, Grace: grace,
			ReclaimStranded: rng.IntN(2) == 0, StrandedGrace: 2 * time.Second, Clock: clk, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		next := 0
		var ids []string // sandboxes ever created, in order
		uidOf := map[string]string{}
		var trace []string
		// check fails when a lease released by something other than DEL (or after
		// DEL's own key) belonged to a sandbox the runtime reports READY.
		check := func(before []ledger.Lease, op string) {
			after := map[ledger.Key]bool{}
			for _, ls := range l.Leases("") {
				after[ls.Key] = true
			}
			for _, ls := range before {
				if after[ls.Key] {
					continue
				}
				h, _ := l.History("net", ls.IPs[0].Addr())
				reason := h[len(h)-1].Reason
				if reason == ledger.ReasonDEL {
					continue
				}
				releasedByRec++
				rt.mu.Lock()
				st, known := rt.state[ls.Key.ContainerID]
				rt.mu.Unlock()
				if known && st == cri.StateReady {
					t.Fatalf("seed %d: %s released %s (reason %s) while its sandbox is READY\ntrace: %v", seed, op, ls.Key, reason, trace)
				}
			}
			rep, err := l.Audit()
			if err != nil || !rep.OK {
				t.Fatalf("seed %d: audit %v %+v", seed, err, rep)
			}
		}
		for step := 0; step < 300; step++ {
			before := l.Leases("")
			var op string
			switch p := rng.IntN(100); {
			case p < 12: // ADD for a new sandbox, maybe of an existing pod (re-creation)
				id := fmt.Sprintf("s%d", next)
				next++
				uid := fmt.Sprintf("u%d", rng.IntN(6))
				uidOf[id] = uid
				ids = append(ids, id)
				req := ledger.AllocateRequest{Key: key(id), Pod: ledger.Pod{UID: uid}, NetNS: ledger.NetNS{Path: "/ns/" + id, Dev: 4, Ino: uint64(next)}, Ranges: ranges}
				olds := l.LeasesOfPod("net", uid)
				if len(olds) > 0 {
					req.Supersede = r.Supersedable(ctx, olds)
				}
				if rng.IntN(4) > 0 {
					rt.set(id, cri.StateReady) // else: still in creation
				}
				op = "add " + id
				if _, _, err := l.Allocate(req); err != nil && !errors.Is(err, ledger.ErrPoolExhausted) {
					t.Fatal(err)
				}
			case p < 20 && len(ids) > 0: // DEL
				id := ids[rng.IntN(len(ids))]
				op = "del " + id
				l.Release(key(id), ledger.ReasonDEL, "")
			case p < 32 && len(ids) > 0: // sandbox state change
				id := ids[rng.IntN(len(ids))]
				switch rng.IntN(3) {
				case 0:
					rt.mu.Lock()
					if _, ok := rt.state[id]; ok || rng.IntN(3) == 0 {
						rt.state[id] = cri.StateReady // created late, or (rarely) back
					}
					rt.mu.Unlock()
					op = "ready " + id
				case 1:
					rt.mu.Lock()
					if _, ok := rt.state[id]; ok {
						rt.state[id] = cri.StateNotReady
					}
					rt.mu.Unlock()
					op = "stop " + id
				case 2:
					rt.remove(id)
					op = "remove " + id
				}
			case p < 37: // the API says anything of any pod
				uid := fmt.Sprintf("u%d", rng.IntN(6))
				api.mu.Lock()
				switch rng.IntN(5) {
				case 0:
					delete(api.pods, uid)
				case 1:
					api.pods[uid] = fakePod{phase: []string{"Pending", "Running", "Succeeded", "Failed"}[rng.IntN(4)]}
				case 2:
					api.synced = !api.synced
				default:
					api.pods[uid] = fakePod{phase: "Succeeded"}
				}
				op = fmt.Sprintf("api %s %+v synced=%v", uid, api.pods[uid], api.synced)
				api.mu.Unlock()
			case p < 42 && len(ids) > 0: // namespace change (even for READY sandboxes)
				id := ids[rng.IntN(len(ids))]
				s := nsStates[rng.IntN(len(nsStates))]
				ns.set("/ns/"+id, s)
				op = "netns " + id + " " + s.String()
			case p < 50: // runtime trouble
				rt.mu.Lock()
				switch rng.IntN(5) {
				case 0:
					rt.listErr = nil
					if rng.IntN(2) == 0 {
						rt.listErr = errors.New("unavailable")
					}
				case 1:
					rt.statusErr = nil
					if rng.IntN(3) == 0 {
						rt.statusErr = errors.New("deadline exceeded")
					}
				case 2:
					rt.empty = rng.IntN(3) == 0
				case 3:
					rt.hide = map[string]bool{}
					for _, id := range ids {
						if rng.IntN(4) == 0 {
							rt.hide[id] = true
						}
					}
				case 4:
					rt.listErr, rt.statusErr, rt.empty, rt.hide = nil, nil, false, map[string]bool{}
				}
				op = fmt.Sprintf("runtime listErr=%v statusErr=%v empty=%v hidden=%d", rt.listErr != nil, rt.statusErr != nil, rt.empty, len(rt.hide))
				rt.mu.Unlock()
			case p < 55 && len(before) > 0: // GC asks
				ls := before[rng.IntN(len(before))]
				op = "gc " + ls.Key.ContainerID
				if r.MayRelease(ctx, ls) {
					l.ReleaseIfCreated(ls.Key, ls.Created, ledger.ReasonGC, "") // as the agent's GC does
				}
			default: // time passes, a round runs
				clk.Advance(time.Duration(rng.IntN(int(2 * interval))))
				op = "round"
				r.Reconcile(ctx)
				rounds++
			}
			trace = append(trace, op)
			if len(trace) > 40 {
				trace = trace[1:]
			}
			check(before, op)
		}
	}
	t.Logf("%d seeds, %d rounds, %d releases by reconcile/supersede/GC checked", seeds, rounds, releasedByRec)
	if releasedByRec == 0 {
		t.Fatal("the property test released nothing: it exercises nothing")
	}
}
