package bench

import (
	"math"
	"strings"
	"testing"
)

// runValues are the values of a made-up run: ipam is ipledger's ratio to host-local at
// 0 and 50% fill, ipamFull at 95% (every verb and quantile); vsFloor its ratio to the
// floor; veth the main plugin's ratio to ptp + host-local; burst the bursts' ratio;
// startMs, rssMiB and rssRestartMiB the agent's rows.
type runValues struct {
	ipam, ipamFull, vsFloor, veth, burst, startMs, rssMiB, rssRestartMiB float64
	vethP99                                                              float64 // 0: veth
}

// rowsOf is the report of a run with the values v.
func rowsOf(v runValues, o Options) *Report {
	r := &Report{}
	add := func(group, name, unit string, ipl, base, floor float64) {
		r.Rows = append(r.Rows, Row{Group: group, Name: name, Unit: unit, IPledger: ipl, Baseline: base, Floor: floor})
	}
	for _, verb := range []string{"ADD", "DEL"} {
		for _, pct := range fills {
			vs := v.ipam
			if pct == fills[len(fills)-1] {
				vs = v.ipamFull
			}
			for _, q := range []string{"p50", "p99"} {
				hl := 4.0
				add(groupIPAM, fillName(verb, pct, q, o.PoolBits), "ms", vs*hl, hl, vs*hl/v.vsFloor)
			}
		}
		add(groupBurst, burstName(verb), "ms", v.burst*300, 300, 90)
		add(groupMain, verb+" p50", "ms", v.veth*10, 10, 2)
		vethP99 := v.veth
		if v.vethP99 != 0 {
			vethP99 = v.vethP99
		}
		add(groupMain, verb+" p99", "ms", vethP99*20, 20, 3)
	}
	add(groupLedger, agentStartName(o.AgentLeases), "ms", v.startMs, nan, nan)
	add(groupLedger, rssName+kilo(o.AgentLeases)+" live leases", "MiB", v.rssMiB, nan, nan)
	add(groupLedger, rssName+kilo(o.AgentLeases)+" live leases, after a restart", "MiB", v.rssRestartMiB, nan, nan)
	add(groupLedger, reconcileCPUName(10000)+", CPU", "ms", 12, nan, nan)
	return r
}

// TestTargets evaluates issue 13's goals on made-up rows: each goal is met exactly at
// its limit, missed just above it, and reports its worst value and where.
func TestTargets(t *testing.T) {
	o := Options{PoolBits: 22, BurstSize: 110, AgentLeases: 64000}
	met := runValues{ipam: 0.8, ipamFull: 0.25, vsFloor: 1.6, veth: 0.9, burst: 0.6, startMs: 300, rssMiB: 100, rssRestartMiB: 91}
	goals := []string{
		"ipledger ADD p50 and p99 ≤ 0.8× host-local at 0, 50 and 95% fill",
		"ipledger ADD p50 and p99 ≤ 0.25× host-local at 95% fill",
		"ipledger ADD p50 ≤ 1.6× the exec floor at every fill",
		"ipledger DEL p50 and p99 ≤ 0.8× host-local at 0, 50 and 95% fill",
		"ipledger DEL p50 and p99 ≤ 0.25× host-local at 95% fill",
		"ipledger DEL p50 ≤ 1.6× the exec floor at every fill",
		"ipledger-veth + ipledger ADD and DEL p50 ≤ 0.9× ptp + host-local",
		"burst of 110 concurrent ADDs and of 110 DELs ≤ 0.6× host-local's wall time",
		"agent start until it answers at 64k leases ≤ 300 ms",
		"agent RSS at 64k leases ≤ 100 MiB",
		"reconcile pass over 10,000 leases < 100 ms of CPU",
	}
	for _, tc := range []struct {
		name   string
		edit   func(*runValues)
		missed map[string]string // goal → its Measured text; every other goal met
	}{
		{name: "every goal met at its limit", edit: func(*runValues) {}},
		{name: "host-local ratio above 0.8 (the worst fill is below 95%)", edit: func(v *runValues) { v.ipam = 0.81 },
			missed: map[string]string{goals[0]: "worst 0.81× (p50 at 0%)", goals[3]: "worst 0.81× (p50 at 0%)"}},
		{name: "host-local ratio at 95% above 0.25", edit: func(v *runValues) { v.ipamFull = 0.3 },
			missed: map[string]string{goals[1]: "worst 0.30× (p50 at 95%)", goals[4]: "worst 0.30× (p50 at 95%)"}},
		{name: "above 1.6 the floor", edit: func(v *runValues) { v.vsFloor = 1.7 },
			missed: map[string]string{goals[2]: "worst 1.70× (p50 at 0%)", goals[5]: "worst 1.70× (p50 at 0%)"}},
		{name: "veth above 0.9", edit: func(v *runValues) { v.veth = 0.95 },
			missed: map[string]string{goals[6]: "worst 0.95× (ADD p50)"}},
		{name: "veth p99 above 0.9 (shown, not the goal)", edit: func(v *runValues) { v.vethP99 = 1.2 }},
		{name: "burst above 0.6", edit: func(v *runValues) { v.burst = 0.7 },
			missed: map[string]string{goals[7]: "worst 0.70× (ADD burst)"}},
		{name: "slow agent start", edit: func(v *runValues) { v.startMs = 449.7 },
			missed: map[string]string{goals[8]: "worst 449.7 ms (restart)"}},
		{name: "RSS above 100 MiB after a restart only", edit: func(v *runValues) { v.rssMiB, v.rssRestartMiB = 95, 100.5 },
			missed: map[string]string{goals[9]: "worst 100.5 MiB (after a restart)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := met
			tc.edit(&v)
			got := targets(rowsOf(v, o), o)
			byGoal := map[string]Target{}
			for _, tg := range got {
				byGoal[tg.Goal] = tg
			}
			if len(got) != len(goals) || len(byGoal) != len(goals) {
				t.Errorf("%d goals, want %d: %+v", len(got), len(goals), got)
			}
			for _, g := range goals {
				tg, ok := byGoal[g]
				if !ok {
					t.Errorf("goal %q not evaluated", g)
					continue
				}
				want, miss := tc.missed[g]
				if tg.Met == miss {
					t.Errorf("goal %q: met %v (%s), want %v", g, tg.Met, tg.Measured, !miss)
				}
				if miss && tg.Measured != want {
					t.Errorf("goal %q: measured %q, want %q", g, tg.Measured, want)
				}
				if math.IsNaN(tg.Value) {
					t.Errorf("goal %q: NaN value", g)
				}
			}
		})
	}
}

// TestTargetsWorstAndWhere checks that the worst of a goal's rows is reported with
// its place, NaN comparisons are skipped, and goals without rows are left out.
func TestTargetsWorstAndWhere(t *testing.T) {
	o := Options{PoolBits: 26, BurstSize: 12, AgentLeases: 1000}
	r := &Report{Rows: []Row{
		{Group: groupIPAM, Name: fillName("DEL", 0, "p50", 26), IPledger: 2, Baseline: 4, Floor: 1.5},
		{Group: groupIPAM, Name: fillName("DEL", 50, "p99", 26), IPledger: 3, Baseline: 4, Floor: 2},
		{Group: groupIPAM, Name: fillName("DEL", 95, "p50", 26), IPledger: 1, Baseline: 10, Floor: nan},
		{Group: groupIPAM, Name: fillName("DEL", 95, "p99", 26), IPledger: 1, Baseline: 2, Floor: 1},
		{Group: groupMain, Name: "DEL p99", IPledger: 1, Baseline: nan, Floor: 1},
	}}
	got := map[string]Target{}
	for _, tg := range targets(r, o) {
		got[tg.Goal] = tg
	}
	for goal, want := range map[string]string{
		"ipledger DEL p50 and p99 ≤ 0.8× host-local at 0, 50 and 95% fill": "worst 0.75× (p99 at 50%)",
		"ipledger DEL p50 and p99 ≤ 0.25× host-local at 95% fill":          "worst 0.50× (p99 at 95%)",
		"ipledger DEL p50 ≤ 1.6× the exec floor at every fill":             "worst 1.33× (p50 at 0%)",
	} {
		if got[goal].Measured != want {
			t.Errorf("goal %q: measured %q, want %q", goal, got[goal].Measured, want)
		}
	}
	if len(got) != 3 {
		var names []string
		for g := range got {
			names = append(names, g)
		}
		t.Errorf("goals %s, want only the three DEL goals (no ADD, veth without a baseline, burst, agent rows)", strings.Join(names, "; "))
	}
}

// TestTargetsBound: the IPAM goals carry the lower bound's worst value over the same
// rows, against the same baseline (host-local's ADD for an ADD goal, its DEL for a
// DEL goal) or floor, and whether even the bound meets the goal; the report prints it.
func TestTargetsBound(t *testing.T) {
	o := Options{PoolBits: 22, BurstSize: 110, AgentLeases: 64000}
	var rows []Row
	for _, pct := range fills {
		for _, q := range []string{"p50", "p99"} {
			base := map[int]float64{0: 3, 50: 10, 95: 16}[pct]
			rows = append(rows,
				Row{Group: groupIPAM, Name: fillName("ADD", pct, q, 22), IPledger: 2.7, Baseline: base + 0.5, Floor: 1.5},
				Row{Group: groupIPAM, Name: fillName("DEL", pct, q, 22), IPledger: 2.7, Baseline: base, Floor: 1.5},
				Row{Group: groupIPAM, Name: boundName(pct, q, 22), IPledger: 2.46, Baseline: base, Floor: 1.5})
		}
	}
	r := &Report{Rows: rows}
	r.Targets = targets(r, o)
	got := map[string]Target{}
	for _, tg := range r.Targets {
		got[tg.Goal] = tg
	}
	for goal, want := range map[string]struct {
		bound string
		met   bool
	}{
		"ipledger ADD p50 and p99 ≤ 0.8× host-local at 0, 50 and 95% fill": {"worst 0.70× (p50 at 0%)", true},
		"ipledger DEL p50 and p99 ≤ 0.8× host-local at 0, 50 and 95% fill": {"worst 0.82× (p50 at 0%)", false},
		"ipledger DEL p50 and p99 ≤ 0.25× host-local at 95% fill":          {"worst 0.15× (p50 at 95%)", true},
		"ipledger ADD p50 ≤ 1.6× the exec floor at every fill":             {"worst 1.64× (p50 at 0%)", false},
	} {
		tg := got[goal]
		if tg.Bound != want.bound || tg.BoundMet != want.met {
			t.Errorf("goal %q: bound %q (meets it: %v), want %q (%v)", goal, tg.Bound, tg.BoundMet, want.bound, want.met)
		}
	}
	if tg := got["ipledger-veth + ipledger ADD and DEL p50 ≤ 0.9× ptp + host-local"]; tg.Bound != "" {
		t.Errorf("the veth goal has no bound, got %q", tg.Bound)
	}
	var b strings.Builder
	if err := r.Markdown(&b); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"| ipledger DEL p50 and p99 ≤ 0.8× host-local at 0, 50 and 95% fill | worst 0.90× (p50 at 0%) | no | worst 0.82× (p50 at 0%): misses it |",
		"| ipledger ADD p50 and p99 ≤ 0.8× host-local at 0, 50 and 95% fill | worst 0.77× (p50 at 0%) | yes | worst 0.70× (p50 at 0%): meets it |",
	} {
		if !strings.Contains(b.String(), line+"\n") {
			t.Errorf("report lacks the line\n%s\nin\n%s", line, b.String())
		}
	}
}
