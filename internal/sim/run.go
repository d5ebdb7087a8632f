package sim

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/ipledger/ipledger/internal/api"
)

// Options configure a simulation run.
type Options struct {
	// Scenario is one of Scenarios, or "all".
	Scenario string
	// Pods is how many ordinary pods come and go (each pod is one or more sandbox
	// lifecycles); scenarios with a fixed pod count ignore it.
	Pods int
	Seed uint64
	// Pool is the network's subnet (CIDR); empty takes 10.64.0.0/16. The crash-loop
	// scenario uses its incident's 32 addresses unless Pool is given.
	Pool string
	// BaselinePods caps the pods of the host-local baseline (each of its calls is an
	// exec); 0 skips the baseline.
	BaselinePods int
	// HostLocal is the host-local binary; empty takes HostLocalPath.
	HostLocal string
	// TempDir holds the runs' state (removed after each run); empty takes os.TempDir.
	TempDir string
	// Progress, when set, is told how far each run is (0..1).
	Progress func(system, scenario string, done float64)
	// Reserve are addresses and CIDRs no pod may get (--reserve): ipledger's
	// conflist excludes them (ipam.exclude); host-local has no such setting. Every
	// ADD answered with one of them counts in Result.ReservedHits.
	Reserve []string
}

// Faults counts the faults a run injected.
type Faults struct {
	SecondSandboxes int `json:"secondSandboxes"`
	ChainFailures   int `json:"chainFailures"`
	Crashes         int `json:"crashLoopRecreations"`
	Reboots         int `json:"reboots"`
	RuntimeRestarts int `json:"runtimeRestarts"`
	StaleNetnsDELs  int `json:"staleNetnsDELs"`
	StuckNotReady   int `json:"stuckNotReady"`
	AgentCrashes    int `json:"agentCrashes"`
	SpooledDELs     int `json:"spooledDELs"`
	ClockSteps      int `json:"clockSteps"`
}

// Result is one system's outcome of one scenario; its JSON is the contract of
// `ipledgerctl sim -o json`.
type Result struct {
	System           string  `json:"system"`
	Scenario         string  `json:"scenario"`
	Pods             int     `json:"pods"`
	Lifecycles       int     `json:"lifecycles"`
	LeakedAtEnd      int     `json:"leakedAtEnd"`
	FalseReleases    int     `json:"falseReleases"`
	DoubleAssigned   int     `json:"doubleAssigned"`
	ExhaustionEvents int     `json:"exhaustionEvents"`
	PeakLive         int     `json:"peakLive"`
	ReclaimP50       float64 `json:"reclaimSecondsP50"`
	ReclaimP99       float64 `json:"reclaimSecondsP99"`
	SimulatedSeconds float64 `json:"simulatedSeconds"`
	WallSeconds      float64 `json:"wallSeconds"`
	Faults           Faults  `json:"faults"`
	// ReservedHits counts the ADDs answered with a reserved address (--reserve).
	ReservedHits   int      `json:"reservedHits"`
	FalseReleaseOf []string `json:"falseReleaseOf,omitempty"`
	Note           string   `json:"note,omitempty"`
}

// Balanced reports whether the run ended with nothing leaked and no invariant broken.
func (r Result) Balanced() bool {
	return r.LeakedAtEnd == 0 && r.FalseReleases == 0 && r.DoubleAssigned == 0
}

// Run simulates the scenario(s) for ipledger and, unless BaselinePods is 0, for the
// host-local baseline, and returns one Result per system and scenario.
func Run(ctx context.Context, o Options) ([]Result, error) {
	names := []string{o.Scenario}
	if o.Scenario == "all" {
		names = Scenarios
	}
	if o.Pods <= 0 {
		return nil, fmt.Errorf("--pods: %d; give a positive number of pods", o.Pods)
	}
	if o.BaselinePods < 0 {
		return nil, fmt.Errorf("--baseline-pods: %d; give 0 (no baseline) or more", o.BaselinePods)
	}
	var custom [3]string
	if o.Pool != "" {
		p, err := netip.ParsePrefix(o.Pool)
		if err != nil || p.Masked() != p {
			return nil, fmt.Errorf("--pool: %q is not a network in CIDR notation (e.g. 10.64.0.0/16)", o.Pool)
		}
		if p.Addr().Is4() && p.Bits() > 27 {
			return nil, fmt.Errorf("--pool: %s is too small; give a /27 or larger", o.Pool)
		}
		custom[0] = p.String()
	}
	for _, r := range o.Reserve {
		if _, err := api.ParseExclude(r); err != nil {
			return nil, fmt.Errorf("--reserve: %v", err)
		}
	}
	if o.HostLocal == "" {
		o.HostLocal = HostLocalPath
	}
	var out []Result
	for _, name := range names {
		k, err := scenarioKnobs(name)
		if err != nil {
			return nil, err
		}
		pool := [3]string{"10.64.0.0/16"}
		if k.pool[0] != "" {
			pool = k.pool
		}
		if custom[0] != "" {
			pool = custom
		}
		pods := o.Pods
		if k.fixedPods > 0 {
			pods = k.fixedPods
		}
		r, err := runOne(ctx, o, name, k, pods, pool, false)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
		if o.BaselinePods == 0 {
			continue
		}
		bp := min(pods, o.BaselinePods)
		r, err = runOne(ctx, o, name, k, bp, pool, true)
		if err != nil {
			return nil, err
		}
		if bp < pods {
			r.Note = fmt.Sprintf("host-local at %d of %d pods: every call execs the binary", bp, pods)
		}
		out = append(out, r)
	}
	return out, nil
}

func runOne(ctx context.Context, o Options, name string, k knobs, pods int, pool [3]string, baseline bool) (Result, error) {
	tmp, err := os.MkdirTemp(o.TempDir, "ipledger-sim-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(tmp)
	start := time.Now()
	w := newWorld(ctx, k, pods, o.Seed, tmp)
	for _, r := range o.Reserve {
		p, _ := api.ParseExclude(r)
		w.reserved = append(w.reserved, p)
	}
	var b backend
	if baseline {
		b, err = newHostLocal(w, o.HostLocal, filepath.Join(tmp, "host-local"), pool)
	} else {
		b, err = newIpledger(w, filepath.Join(tmp, "ipledger"), pool, o.Reserve)
	}
	if err != nil {
		return Result{}, err
	}
	w.b = b
	if o.Progress != nil {
		w.progr = func(f float64) { o.Progress(b.name(), name, f) }
	}
	err = w.run()
	if cerr := b.close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Result{}, fmt.Errorf("sim %s on %s: %w", name, b.name(), err)
	}
	if o.Progress != nil {
		o.Progress(b.name(), name, 1)
	}
	c := w.c
	r := Result{System: b.name(), Scenario: name, Pods: c.pods, Lifecycles: c.lifecycles, LeakedAtEnd: c.leakedAtEnd,
		FalseReleases: c.falseReleases, DoubleAssigned: c.doubleAssigned, ExhaustionEvents: c.exhaustion, PeakLive: c.peakLive,
		ReservedHits: c.reservedHits, SimulatedSeconds: w.now().Seconds(), WallSeconds: time.Since(start).Seconds(), FalseReleaseOf: w.falseWhy,
		Faults: Faults{SecondSandboxes: c.secondSandboxes, ChainFailures: c.chainFailures, Crashes: c.crashes, Reboots: c.reboots,
			RuntimeRestarts: c.restarts, StaleNetnsDELs: c.staleDELs, StuckNotReady: c.stuck, AgentCrashes: c.agentCrashes, SpooledDELs: c.spooled, ClockSteps: c.clockSteps}}
	r.ReclaimP50, r.ReclaimP99 = percentile(c.reclaim, 0.50), percentile(c.reclaim, 0.99)
	if len(r.FalseReleaseOf) > 10 {
		r.FalseReleaseOf = r.FalseReleaseOf[:10]
	}
	return r, nil
}

func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(q * float64(len(s)-1))
	return s[i]
}
