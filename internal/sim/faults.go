package sim

import (
	"fmt"
	"math/rand/v2"
	"time"
)

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
