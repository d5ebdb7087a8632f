package sim

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

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
	for _, p := range w.reserved {
		if p.Contains(addr) {
			w.c.reservedHits++
		}
	}
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
