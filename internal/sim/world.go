package sim

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/reconcile"
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

// errExhausted marks an ADD refused because the pool has no free address.
var errExhausted = errors.New("pool exhausted")

// errChained is the failing chained plugin of seed 001.
var errChained = errors.New("chained plugin failed")

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

// simClock is the simulated clock: wall time for records, a monotonic reading for
// durations; Step moves the wall clock only, as NTP or an operator does. It is also
// the node's boot clock: reboot starts a new boot, an agent restart does not.
type simClock struct {
	wall   time.Time
	mono   time.Duration
	boots  int           // boots since the first one
	bootAt time.Duration // mono at the current boot's start
}

var (
	_ clock.Clock = (*simClock)(nil)
	_ clock.Boot  = (*simClock)(nil)
)

func (c *simClock) Now() time.Time      { return c.wall }
func (c *simClock) Mono() time.Duration { return c.mono }

// Boot names the current boot and the time since it started.
func (c *simClock) Boot() (string, time.Duration, bool) {
	return fmt.Sprintf("sim-boot-%d", c.boots), c.mono - c.bootAt, true
}

// reboot starts a new boot now.
func (c *simClock) reboot() { c.boots++; c.bootAt = c.mono }

func (c *simClock) advanceTo(m time.Duration) {
	if m > c.mono {
		c.wall = c.wall.Add(m - c.mono)
		c.mono = m
	}
}

type sbState int

const (
	sbCreating sbState = iota
	sbReady
	sbNotReady
	sbRemoved
)

type pod struct {
	idx      int
	uid      string
	name     string
	end      time.Duration // when the pod completes
	done     bool
	cur      *sandbox
	attempts int
	fails    int // consecutive failed sandbox creations (back-off)
	crashes  int
	crashy   bool
	second   bool // 000: a second sandbox after completion
	chainBad int  // 001: attempts whose chained plugin fails
}

type sandbox struct {
	id      string
	pod     *pod
	attempt int
	state   sbState
	netns   string // path given at ADD
	nsAlive bool
	addr    netip.Addr
	held    bool // the IPAM's books hold addr for it (as observed)
	unused  time.Duration
	stopped bool // unused is set: the sandbox no longer uses its address
	chain   bool // its chained plugin fails (001)
	stuck   bool // 004: NOTREADY, nobody will collect it
	pid     int
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
func (q *queue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// counters are a run's results.
type counters struct {
	pods, lifecycles, leakedAtEnd, falseReleases, doubleAssigned, exhaustion, peakLive int
	reclaim                                                                            []float64
	stuck, secondSandboxes, chainFailures, crashes, reboots, restarts, agentCrashes    int
	clockSteps, spooled, staleDELs                                                     int
}

// world is the simulated node: kubelet, the runtime, the namespaces, the clock.
type world struct {
	k     knobs
	seed  uint64
	pods  int
	clk   *simClock
	q     queue
	seq   uint64
	b     backend
	c     counters
	ctx   context.Context
	tmp   string
	pend  int // pending pod events
	progr func(done float64)

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

// scheduleFaults draws the node-wide fault timeline from its own stream.
func (w *world) scheduleFaults() {
	horizon := w.k.duration
	if horizon == 0 {
		horizon = time.Duration(w.pods)*(minLife+maxLife)/2/targetLive + maxLife
	}
	plan := func(stream uint64, mean time.Duration, fn func(r *rand.Rand)) {
		if mean <= 0 {
			return
		}
		// a short run (the baseline's, a test's) still meets the fault a few times
		mean = min(mean, horizon/4)
		r := w.rng(stream)
		for t := expo(r, mean); t < horizon; t += expo(r, mean) {
			w.at(t, false, func() {
				if !w.settling {
					fn(r)
				}
			})
		}
	}
	plan(2, w.k.reboot, func(*rand.Rand) { w.reboot() })
	plan(3, w.k.runtimeRestart, func(r *rand.Rand) { w.runtimeRestart(r) })
	plan(4, w.k.agentCrash, func(r *rand.Rand) {
		if w.b.down() {
			return
		}
		if !w.b.crash(r.IntN(2) == 0) {
			return // no agent to crash (host-local)
		}
		w.c.agentCrashes++
		d := uniform(r, agentDownMin, agentDownMax)
		w.after(d, false, func() {
			if err := w.b.restart(); err != nil {
				w.err = err
			}
		})
	})
	plan(5, w.k.clockStep, func(r *rand.Rand) {
		w.c.clockSteps++
		d := uniform(r, time.Minute, clockStepMax)
		if r.IntN(2) == 0 {
			d = -d
		}
		w.clk.wall = w.clk.wall.Add(d)
	})
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

func (w *world) runtimeUp() bool { return w.now() >= w.runtimeDown }

func (w *world) backoff(p *pod) time.Duration {
	d := retryBase << min(p.fails, 5)
	return min(d, retryCap)
}

// runSandbox is kubelet's RunPodSandbox for p and the runtime's CNI ADD.
func (w *world) runSandbox(p *pod) {
	if p.done || (p.cur != nil && p.cur.state == sbReady) {
		return
	}
	if !w.runtimeUp() {
		w.at(w.runtimeDown+time.Second, true, func() { w.runSandbox(p) })
		return
	}
	p.attempts++
	w.c.lifecycles++
	sb := &sandbox{id: fmt.Sprintf("sb%08dx%04d", p.idx, p.attempts), pod: p, attempt: p.attempts, pid: w.pidNext}
	w.pidNext++
	sb.netns = w.tmp + "/netns/" + sb.id
	sb.nsAlive = true
	sb.chain = p.attempts <= p.chainBad
	w.sandboxes[sb.id] = sb
	addr, err := w.chainAdd(sb)
	if err != nil {
		if errors.Is(err, errExhausted) {
			w.c.exhaustion++
		}
		if errors.Is(err, errChained) {
			w.c.chainFailures++
		}
		// the runtime tears the failed sandbox down; a teardown error after a
		// failed setup is swallowed (seed 001)
		_ = w.chainDel(sb, sb.netns)
		w.removeNetns(sb)
		sb.state = sbRemoved
		w.forget(sb)
		p.fails++
		w.after(w.backoff(p), true, func() { w.runSandbox(p) })
		return
	}
	_ = addr
	p.fails = 0
	sb.state = sbReady
	p.cur = sb
	w.list(sb)
	if p.crashy {
		r := w.rng(uint64(5_000_000 + p.idx*10_000 + p.attempts))
		w.after(uniform(r, crashRunMin, crashRunMax), true, func() { w.crashLoop(sb) })
	}
}

// chainAdd is the CNI chain's ADD: the main plugin (with IPAM), then the chained one.
func (w *world) chainAdd(sb *sandbox) (netip.Addr, error) {
	addr, err := w.b.add(sb)
	if err != nil {
		return netip.Addr{}, err
	}
	sb.addr, sb.held = addr, true
	if u := w.users[addr]; u != nil && u != sb && u.nsAlive && u.addr == addr {
		w.c.doubleAssigned++
	}
	w.users[addr] = sb
	if n, err := w.b.held(false); err == nil && n > w.c.peakLive {
		w.c.peakLive = n
	} else if err != nil {
		w.err = err
	}
	if sb.chain {
		return addr, fmt.Errorf("%w: ADD of %s", errChained, sb.id)
	}
	return addr, nil
}

// chainDel is the CNI chain's DEL with CNI_NETNS netns: the chained plugin first,
// then the main plugin, which calls IPAM DEL.
func (w *world) chainDel(sb *sandbox, netns string) error {
	if sb.chain {
		return fmt.Errorf("%w: DEL of %s", errChained, sb.id)
	}
	if w.b.mainPluginNeedsNetns() {
		// the incidents' main plugins find the address through the namespace
		switch {
		case netns == "":
			return nil // nothing found: answers success, IPAM never asked (seed 000)
		case netns != sb.netns || !sb.nsAlive:
			return fmt.Errorf("netns %s: no such namespace", netns) // seed 003
		}
	}
	// ipledger-veth: IPAM DEL first, never needing the namespace; then the link,
	// only in the namespace recorded at ADD
	if err := w.b.del(sb, netns); err != nil {
		return err
	}
	if netns == sb.netns && sb.nsAlive {
		w.unconfigure(sb)
	}
	return nil
}

func (w *world) unconfigure(sb *sandbox) {
	if sb.addr.IsValid() && w.users[sb.addr] == sb {
		delete(w.users, sb.addr)
	}
}

func (w *world) removeNetns(sb *sandbox) {
	if !sb.nsAlive {
		return
	}
	sb.nsAlive = false
	w.unconfigure(sb)
	if !sb.stopped {
		sb.stopped, sb.unused = true, w.now()
	}
}

func (w *world) list(sb *sandbox) {
	w.listIdx[sb] = len(w.listed)
	w.listed = append(w.listed, sb)
}

// forget removes sb from the runtime (RemovePodSandbox, or a failed creation).
func (w *world) forget(sb *sandbox) {
	sb.state = sbRemoved
	if !sb.stopped {
		sb.stopped, sb.unused = true, w.now()
	}
	if i, ok := w.listIdx[sb]; ok {
		last := w.listed[len(w.listed)-1]
		w.listed[i] = last
		w.listIdx[last] = i
		w.listed = w.listed[:len(w.listed)-1]
		delete(w.listIdx, sb)
	}
	if !sb.held {
		delete(w.sandboxes, sb.id)
	}
}

// complete is the pod finishing: kubelet stops its sandbox.
func (w *world) complete(p *pod) {
	p.done = true
	sb := p.cur
	if sb == nil || sb.state != sbReady {
		return
	}
	w.stopSandbox(sb)
	if p.second {
		// seed 000: kubelet starts a second sandbox for the Completed pod, then
		// kills it; its namespace is gone before its DEL, which comes with an empty
		// CNI_NETNS
		w.c.secondSandboxes++
		w.after(time.Second, true, func() {
			p.done = false
			p.cur = nil
			w.runSandbox(p)
			p.done = true
			s2 := p.cur
			if s2 == nil || s2.state != sbReady {
				return
			}
			w.after(secondKillDelay, true, func() {
				if s2.state != sbReady {
					return
				}
				w.removeNetns(s2)
				s2.state = sbNotReady
				_ = w.chainDel(s2, "")
				w.forget(s2)
			})
		})
	}
}

// stopSandbox is StopPodSandbox: CNI DEL with the namespace, the namespace removed,
// the sandbox NOTREADY; RemovePodSandbox follows later.
func (w *world) stopSandbox(sb *sandbox) {
	if !w.runtimeUp() {
		// seed 004: the runtime restarts during the stop; the sandbox ends NOTREADY
		// with its namespace closed, no DEL was sent, and nobody collects it
		w.removeNetns(sb)
		sb.state = sbNotReady
		sb.stuck = true
		w.c.stuck++
		return
	}
	// kubelet has decided: the sandbox is being stopped (not READY) when its DEL runs
	sb.state = sbNotReady
	_ = w.chainDel(sb, sb.netns)
	w.removeNetns(sb)
	r := w.rng(uint64(9_000_000 + sb.pod.idx*10_000 + sb.attempt))
	w.after(uniform(r, gcDelayMin, gcDelayMax), true, func() { w.removeSandbox(sb) })
}

// removeSandbox is RemovePodSandbox: containerd's second DEL, with an empty CNI_NETNS.
func (w *world) removeSandbox(sb *sandbox) {
	if sb.state == sbRemoved {
		return
	}
	if !w.runtimeUp() {
		w.at(w.runtimeDown+time.Second, true, func() { w.removeSandbox(sb) })
		return
	}
	_ = w.chainDel(sb, "")
	w.forget(sb)
}

// crashLoop is seed 002: the sandbox dies and is re-created under a new ID; the old
// one's DEL is skipped.
func (w *world) crashLoop(sb *sandbox) {
	p := sb.pod
	if sb.state != sbReady || p.cur != sb {
		return
	}
	w.c.crashes++
	w.removeNetns(sb)
	w.forget(sb)
	p.cur = nil
	if p.done {
		return
	}
	p.crashes++
	d := min(retryBase<<min(p.crashes-1, 5), retryCap)
	w.after(d, true, func() { w.runSandbox(p) })
}

// reboot is seed 003: the node goes down; every namespace is gone; at boot the
// runtime lists the old sandboxes NOTREADY and kubelet stops each with a DEL whose
// CNI_NETNS is the stale /proc/PID/ns/net path, then re-creates the pods.
func (w *world) reboot() {
	w.c.reboots++
	w.clk.reboot()
	var old []*sandbox
	for _, sb := range w.listed {
		if sb.state == sbReady {
			old = append(old, sb)
		}
		w.removeNetns(sb)
		sb.state = sbNotReady
	}
	if !w.b.down() {
		w.b.crash(false)
	}
	w.runtimeDown = max(w.runtimeDown, w.now()+bootTime)
	w.after(bootTime, false, func() {
		if w.b.down() {
			if err := w.b.restart(); err != nil {
				w.err = err
			}
		}
	})
	for i, sb := range old {
		stale := fmt.Sprintf("/proc/%d/ns/net", sb.pid)
		w.c.staleDELs++
		p := sb.pod
		first := i%2 == 0
		w.after(bootTime+time.Second, true, func() {
			if first {
				w.runSandbox(p) // re-created first: supersession meets the old lease
			}
			_ = w.chainDel(sb, stale)
			w.removeSandbox(sb)
			if !first {
				w.runSandbox(p)
			}
		})
	}
}

// runtimeRestart is seed 004: listings fail while the runtime is down, then it lists
// part of its sandboxes and answers NotFound for the others while it reloads.
func (w *world) runtimeRestart(r *rand.Rand) {
	w.c.restarts++
	down := uniform(r, restartDownMin, restartDownMax)
	w.runtimeDown = max(w.runtimeDown, w.now()+down)
	w.reloadUntil = max(w.reloadUntil, w.runtimeDown+reloadTime)
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

// runtime is the modelled container runtime as the reconciler sees it.
type runtime struct{ w *world }

var _ reconcile.Runtime = runtime{}

var errRuntimeDown = errors.New("runtime restarting: connection refused")

// reloading reports whether the runtime has not yet reloaded sb: it is neither listed
// nor found (a runtime that forgot its state while it restarts).
func (w *world) reloading(sb *sandbox) bool {
	return w.now() < w.reloadUntil && sb.pid%2 == 1
}

func (r runtime) ListSandboxes(context.Context) ([]cri.Sandbox, error) {
	w := r.w
	if !w.runtimeUp() {
		return nil, errRuntimeDown
	}
	out := make([]cri.Sandbox, 0, len(w.listed))
	for _, sb := range w.listed {
		if w.reloading(sb) {
			continue
		}
		out = append(out, criOf(sb))
	}
	return out, nil
}

func (r runtime) SandboxStatus(_ context.Context, id string) (cri.Sandbox, error) {
	w := r.w
	if !w.runtimeUp() {
		return cri.Sandbox{}, errRuntimeDown
	}
	sb := w.sandboxes[id]
	if sb == nil || sb.state == sbRemoved || w.reloading(sb) {
		return cri.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, cri.ErrNotFound)
	}
	if sb.state == sbCreating {
		return cri.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, cri.ErrNotFound)
	}
	return criOf(sb), nil
}

func criOf(sb *sandbox) cri.Sandbox {
	st := cri.StateNotReady
	if sb.state == sbReady {
		st = cri.StateReady
	}
	return cri.Sandbox{ID: sb.id, State: st, Namespace: podNamespace, Name: sb.pod.name, UID: sb.pod.uid, Attempt: uint32(sb.attempt)}
}

// namespaces is the modelled network namespaces as the reconciler probes them: a
// namespace is known by the path recorded at ADD (unique per sandbox here).
type namespaces struct{ w *world }

var _ reconcile.Netns = namespaces{}

func (n namespaces) Probe(ns ledger.NetNS, ips []netip.Prefix) (reconcile.NSState, string) {
	if ns.Path == "" {
		return reconcile.NSNotRecorded, ""
	}
	sb := n.w.byNetns(ns.Path)
	if sb == nil || !sb.nsAlive {
		return reconcile.NSGone, ns.Path + " does not exist"
	}
	for _, p := range ips {
		if n.w.users[p.Addr()] == sb {
			return reconcile.NSAddrPresent, p.Addr().String() + " configured"
		}
	}
	return reconcile.NSAddrAbsent, ""
}

func (n namespaces) Reclaim(ledger.NetNS, string, []netip.Prefix) (string, error) {
	return "", errors.New("sim: stranded reclaim is not modelled")
}

func (w *world) byNetns(path string) *sandbox {
	prefix := w.tmp + "/netns/"
	if len(path) <= len(prefix) || path[:len(prefix)] != prefix {
		return nil
	}
	return w.sandboxes[path[len(prefix):]]
}
