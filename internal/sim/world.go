package sim

import (
	"container/heap"
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"
)

// Model constants: kubelet's and the runtime's timings.
const (
	ifName          = "eth0"
	network         = "sim"
	podNamespace    = "sim"
	targetLive      = 100              // live pods the arrival rate aims at
	minLife         = 30 * time.Second // pod lifetime, uniform
	maxLife         = 10 * time.Minute
	gcDelayMin      = 10 * time.Second // StopPodSandbox to RemovePodSandbox
	gcDelayMax      = time.Minute
	retryBase       = 10 * time.Second // kubelet's sandbox back-off: 10 s doubling
	retryCap        = 5 * time.Minute  // up to 5 min
	crashRunMin     = 5 * time.Second  // a crash-looping sandbox lives this long
	crashRunMax     = time.Minute
	restartDownMin  = 10 * time.Second // runtime restart: listing fails
	restartDownMax  = time.Minute
	reloadTime      = 30 * time.Second // then it lists part of its sandboxes
	bootTime        = time.Minute      // node reboot: everything down this long
	agentDownMin    = time.Second
	agentDownMax    = 30 * time.Second
	clockStepMax    = 2 * time.Hour
	reconcileEvery  = 30 * time.Second // ipledgerd's defaults
	releaseGrace    = 60 * time.Second
	reuseDelay      = 30 * time.Second
	settleRounds    = 4
	secondKillDelay = 5 * time.Second
)

// backend is one IPAM system as the modelled chain drives it.
//
// Contract: add runs IPAM ADD for sb and returns its address, or an error wrapping
// errExhausted when the pool has none; del runs IPAM DEL for sb; both report every
// release they observe through world.released. round runs one reconciliation round
// (a no-op for a system without one). holds reports whether the system's books hold
// sb's address for sb. held counts the addresses its books hold. crash and restart
// model the agent dying and coming back from its store (no-ops without an agent).
// mainPluginNeedsNetns tells the chain model which main plugin sits in front.
type backend interface {
	name() string
	add(sb *sandbox) (netip.Addr, error)
	del(sb *sandbox, netns string) error
	round()
	holds(sb *sandbox) bool
	held(exact bool) (int, error)
	crash(afterNextCommit bool) bool
	restart() error
	down() bool
	mainPluginNeedsNetns() bool
	close() error
}

type event struct {
	at  time.Duration
	seq uint64
	pod bool // a pod's event: the run lasts while any is pending
	fn  func()
}

type queue []*event

func (q queue) Len() int { return len(q) }

func (q queue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}

func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }

func (q *queue) Push(x any) { *q = append(*q, x.(*event)) }

func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// counters are a run's results.
type counters struct {
	pods, lifecycles, leakedAtEnd, falseReleases, doubleAssigned, exhaustion, peakLive int
	reservedHits                                                                       int
	reclaim                                                                            []float64
	stuck, secondSandboxes, chainFailures, crashes, reboots, restarts, agentCrashes    int
	clockSteps, spooled, staleDELs                                                     int
}

// world is the simulated node: kubelet, the runtime, the namespaces, the clock.
type world struct {
	// reserved: no ADD may be answered with one of these (Options.Reserve)
	reserved []netip.Prefix
	k        knobs
	seed     uint64
	pods     int
	clk      *simClock
	q        queue
	seq      uint64
	b        backend
	c        counters
	ctx      context.Context
	tmp      string
	pend     int // pending pod events
	progr    func(done float64)

	sandboxes map[string]*sandbox
	listed    []*sandbox // the runtime's sandboxes (READY and NOTREADY), in creation order
	listIdx   map[*sandbox]int
	users     map[netip.Addr]*sandbox // address -> sandbox whose live namespace has it configured
	allPods   []*pod

	runtimeDown  time.Duration // until then listing and sandbox calls fail
	reloadUntil  time.Duration // until then the runtime lists part of its sandboxes
	arrived      int
	settling     bool
	settleUntil  time.Duration
	lastProgress time.Duration
	pidNext      int
	falseWhy     []string
	err          error
}

func newWorld(ctx context.Context, k knobs, pods int, seed uint64, tmp string) *world {
	return &world{k: k, pods: pods, seed: seed, ctx: ctx, tmp: tmp,
		clk:       &simClock{wall: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), bootAt: -bootTime},
		sandboxes: map[string]*sandbox{}, listIdx: map[*sandbox]int{}, users: map[netip.Addr]*sandbox{},
		pidNext: 1000}
}

func (w *world) now() time.Duration { return w.clk.mono }

func (w *world) at(t time.Duration, podEvent bool, fn func()) {
	w.seq++
	if podEvent {
		w.pend++
	}
	heap.Push(&w.q, &event{at: t, seq: w.seq, pod: podEvent, fn: fn})
}

func (w *world) after(d time.Duration, podEvent bool, fn func()) { w.at(w.now()+d, podEvent, fn) }

// rng returns the random stream of one subject (a pod, the fault timeline), so that
// both systems see the same schedule whatever they do.
func (w *world) rng(stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(w.seed, stream*0x9e3779b97f4a7c15+1))
}

func uniform(r *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

func expo(r *rand.Rand, mean time.Duration) time.Duration {
	return time.Duration(r.ExpFloat64() * float64(mean))
}

// run simulates the whole scenario.
func (w *world) run() error {
	w.schedulePods()
	w.scheduleFaults()
	w.after(reconcileEvery, false, w.tick)
	for w.q.Len() > 0 && w.err == nil {
		if err := w.ctx.Err(); err != nil {
			return err
		}
		e := heap.Pop(&w.q).(*event)
		if w.settling && e.at > w.settleUntil {
			break
		}
		w.clk.advanceTo(e.at)
		if e.pod {
			w.pend--
		}
		e.fn()
		if !w.settling && w.pend == 0 && w.arrived == w.pods {
			// every pod has come and gone: let the reconciler finish its work with a
			// healthy runtime and agent
			w.settling = true
			w.settleUntil = w.now() + releaseGrace + settleRounds*reconcileEvery
			w.runtimeDown, w.reloadUntil = 0, 0
			if w.b.down() {
				if err := w.b.restart(); err != nil {
					return err
				}
			}
		}
		if w.progr != nil && w.now()-w.lastProgress > time.Minute {
			w.lastProgress = w.now()
			w.progr(w.progress())
		}
	}
	if w.err != nil {
		return w.err
	}
	return w.finish()
}

func (w *world) progress() float64 {
	if w.k.duration > 0 {
		return min(1, float64(w.now())/float64(w.k.duration))
	}
	return float64(w.arrived) / float64(max(1, w.pods))
}

// schedulePods draws every pod's arrival, lifetime and faults from the pods' own
// streams.
func (w *world) schedulePods() {
	arr := w.rng(1)
	var t time.Duration
	mean := (minLife + maxLife) / 2 / targetLive
	if w.k.duration > 0 {
		mean = w.k.duration / time.Duration(max(1, w.pods))
	}
	for i := 0; i < w.pods; i++ {
		if w.k.duration > 0 {
			t = time.Duration(i) * mean
		} else {
			t += expo(arr, mean)
		}
		w.newPod(i, t, false)
	}
	for i := 0; i < w.k.crashloopers; i++ {
		w.newPod(w.pods+i, 0, true)
	}
}

func (w *world) newPod(i int, at time.Duration, crashy bool) {
	r := w.rng(uint64(1000 + i))
	p := &pod{idx: i, uid: fmt.Sprintf("uid-%08d", i), name: fmt.Sprintf("pod-%08d", i), crashy: crashy}
	life := uniform(r, minLife, maxLife)
	p.end = at + life
	if crashy {
		p.end = w.k.duration
		if p.end == 0 {
			p.end = time.Duration(w.pods) * (minLife + maxLife) / 2 / targetLive
		}
	}
	p.second = r.Float64() < w.k.secondSandbox
	if r.Float64() < w.k.chainFail {
		p.chainBad = 1 + r.IntN(3)
	}
	w.allPods = append(w.allPods, p)
	w.at(at, true, func() {
		if !crashy {
			w.arrived++
		}
		w.c.pods++
		w.runSandbox(p)
	})
	w.at(p.end, true, func() { w.complete(p) })
}

// tick is one reconcile interval: the system's round, then the invariant sweep.
func (w *world) tick() {
	if !w.b.down() {
		w.b.round()
	}
	w.sweep()
	w.after(reconcileEvery, false, w.tick)
}

// sweep checks invariant 2 over every READY sandbox: its address is still held for it.
func (w *world) sweep() {
	for _, sb := range w.listed {
		if sb.state == sbReady && sb.held && !w.b.holds(sb) {
			w.released(sb.id, "unobserved")
		}
	}
}

// released records that the system let go of sb's address, and reports whether sb
// held one. Called by the backends for every release they observe.
func (w *world) released(containerID, why string) bool {
	sb := w.sandboxes[containerID]
	if sb == nil || !sb.held {
		return false
	}
	sb.held = false
	if sb.state == sbRemoved {
		delete(w.sandboxes, sb.id)
	}
	if sb.state == sbReady {
		w.c.falseReleases++
		w.falseWhy = append(w.falseWhy, sb.id+": "+why)
		return true
	}
	var d time.Duration
	if sb.stopped && w.now() > sb.unused {
		d = w.now() - sb.unused
	}
	w.c.reclaim = append(w.c.reclaim, d.Seconds())
	return true
}

// finish counts what the system's books still hold for sandboxes that are not READY.
func (w *world) finish() error {
	n, err := w.b.held(true)
	if err != nil {
		return err
	}
	ready := 0
	for _, sb := range w.listed {
		if sb.state == sbReady && w.b.holds(sb) {
			ready++
		}
	}
	w.c.leakedAtEnd = n - ready
	return nil
}
