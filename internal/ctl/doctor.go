package ctl

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/nsenter"
)

// Check levels, worst last; the exit status of doctor is the worst level's.
const (
	LevelOK   = api.CheckOK
	LevelWarn = api.CheckWarn
	LevelFail = api.CheckFail
)

// CheckLine is one line of doctor's output.
type CheckLine struct {
	Level string `json:"level"`
	Text  string `json:"text"`
}

// DoctorOutput is `doctor -o json|yaml`: the worst level (the exit status's) and
// every check in the order the table prints them.
type DoctorOutput struct {
	Level  string      `json:"level"`
	Checks []CheckLine `json:"checks"`
}

// HostNetns is the namespace doctor checks the loopback of by default: the one of
// PID 1 (the host's, when ipledgerctl runs on the host or in a host-PID pod).
const HostNetns = "/proc/1/ns/net"

// NotReadyAge: a NotReady sandbox older than this is reported (seed 004's signature:
// one nothing collects for months).
const NotReadyAge = time.Hour

// LoopbackUp reports whether "lo" is UP in the network namespace at path. It only
// reads (a netlink handle bound to that namespace; the calling thread never enters it).
func LoopbackUp(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, fmt.Errorf("network namespace %s: %w", path, err)
	}
	defer f.Close()
	nl, err := nsenter.Handle(int(f.Fd()))
	if err != nil {
		return false, fmt.Errorf("netlink in %s: %w", path, err)
	}
	defer nl.Close()
	lo, err := nl.LinkByName("lo")
	if err != nil {
		return false, fmt.Errorf("loopback in %s: %w", path, err)
	}
	return lo.Attrs().Flags&net.FlagUp != 0, nil
}

func doctor(env *Env, socket string, args []string) int {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	nsPath := fs.String("netns", HostNetns, "network namespace whose loopback must be UP (the host's)")
	out := outputFlag(fs)
	if !parseFlags(env, fs, args, out) {
		return ExitError
	}
	lines := Diagnose(env, socket, *nsPath)
	worst, level := ExitOK, LevelOK
	for _, l := range lines {
		switch {
		case l.Level == LevelWarn && worst < 1:
			worst, level = 1, LevelWarn
		case l.Level == LevelFail:
			worst, level = 2, LevelFail
		}
	}
	if printStructured(env, *out, DoctorOutput{Level: level, Checks: lines}) {
		return worst
	}
	for _, l := range lines {
		fmt.Fprintf(env.Stdout, "%-4s %s\n", l.Level, l.Text)
	}
	return worst
}

// Diagnose runs doctor's checks: agent reachable, runtime reachable and its version,
// the host's loopback UP, the spool's backlog, pools within 10% of exhaustion (in
// cluster mode instead: the datastore, the node lease, each network's blocks and the
// leases in lost blocks, as the agent judged them), NotReady sandboxes older than an
// hour, books balanced, clock steps seen.
func Diagnose(env *Env, socket, nsPath string) []CheckLine {
	var out []CheckLine
	add := func(level, format string, a ...any) { out = append(out, CheckLine{level, fmt.Sprintf(format, a...)}) }
	loopback := env.Loopback
	if loopback == nil {
		loopback = LoopbackUp
	}
	switch up, err := loopback(nsPath); {
	case err != nil:
		add(LevelWarn, "host loopback: cannot check %s (%v); fix: run doctor as root on the node, or give --netns", nsPath, err)
	case !up:
		add(LevelFail, "host loopback is DOWN in %s: local services on 127.0.0.1 fail (seed 003: a plugin acting on a reused /proc/PID/ns/net path set it down); fix: ip link set lo up, then find the plugin that did it", nsPath)
	default:
		add(LevelOK, "host loopback is UP (%s)", nsPath)
	}
	resp, err := call(env, socket, api.Request{Op: api.OpDoctor})
	if err != nil || resp.Doctor == nil {
		if err == nil {
			err = errors.New("it answered without a diagnosis (an older agent?)")
		}
		add(LevelFail, "agent not reachable: %v; fix: start ipledgerd (systemctl status ipledgerd, or the DaemonSet's pod) or give --socket; ADDs fail and DELs are spooled meanwhile", err)
		return out
	}
	d := resp.Doctor
	add(LevelOK, "agent reachable at %s", socket)
	switch d.Runtime {
	case "ok":
		add(LevelOK, "runtime reachable: %s", d.RuntimeVersion)
	case "unreachable":
		add(LevelFail, "runtime unreachable: %s; nothing is reconciled while it does not answer; fix: check the runtime (systemctl status containerd) and ipledgerd's --cri-endpoint", d.RuntimeError)
	default:
		add(LevelWarn, "no runtime configured: leases whose DEL never comes are never reclaimed; fix: start ipledgerd with --cri-endpoint unix:///run/containerd/containerd.sock")
	}
	if d.SpoolBacklog > 0 {
		add(LevelWarn, "spool backlog: %d DELs waiting; the agent applies them every few seconds, so a backlog that stays means it cannot; fix: read ipledgerd's log for 'DEL spool'", d.SpoolBacklog)
	} else {
		add(LevelOK, "spool empty")
	}
	if len(d.ClusterChecks) > 0 {
		// cluster mode: the node's pools are its blocks; the agent judged them, its
		// datastore and its node lease (it holds the lease's monotonic clock)
		for _, c := range d.ClusterChecks {
			add(c.Level, "%s", c.Text)
		}
	} else if len(d.Pools) == 0 {
		add(LevelOK, "no pools yet")
	}
	for _, c := range d.NetworkChecks {
		add(c.Level, "%s", c.Text)
	}
	pools := d.Pools
	if len(d.ClusterChecks) > 0 {
		pools = nil // judged above, block by block
	}
	for _, p := range pools {
		switch {
		case p.Exhausted:
			add(LevelFail, "pool %s exhausted: %d of %d addresses in use, %d cooling down; ADDs fail; fix: look for leaks (ipledgerctl audit), wait out --reuse-delay, or widen the network's ranges", p.Network, p.InUse, p.Usable, p.Cooling)
		case p.MostUsed >= 0.9:
			add(LevelWarn, "pool %s within 10%% of exhaustion: %.0f%% of a range set in use (%d addresses in use, %d cooling); fix: look for leaks (ipledgerctl audit) or widen the ranges", p.Network, 100*p.MostUsed, p.InUse, p.Cooling)
		default:
			add(LevelOK, "pool %s: %.0f%% in use", p.Network, 100*p.MostUsed)
		}
	}
	if d.Runtime == "ok" {
		var old []string
		unknown := 0
		for _, sb := range d.NotReady {
			if sb.Created.IsZero() {
				unknown++
				continue
			}
			if age := d.Now.Sub(sb.Created); age > NotReadyAge {
				name := short(sb.ID)
				if sb.Name != "" {
					name = sb.Namespace + "/" + sb.Name + " (" + short(sb.ID) + ")"
				}
				old = append(old, name+" for "+Age(age))
			}
		}
		if len(old) > 0 {
			add(LevelWarn, "%d NotReady sandboxes older than %s: %s; nothing collects them (seed 004); fix: delete their pods, or remove them with the runtime (crictl rmp ID)", len(old), NotReadyAge, strings.Join(old, ", "))
		} else {
			add(LevelOK, "no NotReady sandbox older than %s", NotReadyAge)
		}
		if unknown > 0 {
			add(LevelOK, "%d NotReady sandboxes of unknown age (the runtime reports no creation time and they hold no lease)", unknown)
		}
	}
	if d.BooksBalanced {
		add(LevelOK, "books balanced")
	} else {
		add(LevelFail, "books NOT balanced: %s; fix: ipledgerctl audit explains each problem; keep the state file", strings.Join(d.Problems, "; "))
	}
	if d.ClockSteps > 0 {
		add(LevelWarn, "wall clock stepped %d times since the agent started (last: %s); decisions use monotonic time, but records show the jumps; fix: check time sync (timedatectl)", d.ClockSteps, d.LastStep)
	} else {
		add(LevelOK, "no wall-clock step seen")
	}
	return out
}
