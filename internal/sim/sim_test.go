package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/testenv"
)

// needHostLocal fails the test with the fix when the baseline binary is missing.
func needHostLocal(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(HostLocalPath); err != nil {
		t.Fatalf("%s: %v; run scripts/install-deps.sh (Debian's containernetworking-plugins)", HostLocalPath, err)
	}
}

func run(t *testing.T, k knobs, pods int, pool [3]string, baseline bool) Result {
	t.Helper()
	if pool[0] == "" {
		pool = [3]string{"10.64.0.0/16"}
	}
	r, err := runOne(context.Background(), Options{Seed: 7, HostLocal: HostLocalPath, TempDir: t.TempDir()}, "test", k, pods, pool, baseline)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: pods %d lifecycles %d leaked %d false %d double %d exhaustion %d peak %d reclaim p50/p99 %.0f/%.0f s, faults %+v, %.1fs",
		r.System, r.Pods, r.Lifecycles, r.LeakedAtEnd, r.FalseReleases, r.DoubleAssigned, r.ExhaustionEvents, r.PeakLive,
		r.ReclaimP50, r.ReclaimP99, r.Faults, r.WallSeconds)
	return r
}

var crashPool = [3]string{"10.32.0.0/24", "10.32.0.10", "10.32.0.41"}

// Each fault knob, on host-local, leaks exactly what its incident describes (that is
// how we know the model is faithful); the same knob on ipledger ends balanced.
// Under -short each case runs fewer pods (002: a 20-minute crash loop), every knob
// still meeting its fault (the case fails if it met none), the cases side by side.
func TestKnobs(t *testing.T) {
	needHostLocal(t)
	cases := []struct {
		name string
		k    knobs
		pods int
		pool [3]string
		// leaks is what the incident says host-local leaks: one address per ...
		leaks func(f Faults) int
	}{
		{"000 second sandbox, DEL with empty netns", knobs{secondSandbox: 1}, testenv.Size(40, 12), [3]string{},
			func(f Faults) int { return f.SecondSandboxes }},
		{"001 chained plugin fails ADD and DEL, teardown error swallowed", knobs{chainFail: 1}, testenv.Size(30, 10), [3]string{},
			func(f Faults) int { return f.ChainFailures }},
		{"002 crash-looping pods re-created with the old DEL skipped", knobs{crashloopers: 4,
			duration: time.Duration(testenv.Size(120, 20)) * time.Minute, fixedPods: 20}, 20, crashPool,
			func(f Faults) int { return f.Crashes }},
		{"003 reboot, DEL with a stale /proc/PID/ns/net path", knobs{reboot: 5 * time.Minute}, testenv.Size(100, 30), [3]string{},
			func(f Faults) int { return f.StaleNetnsDELs }},
		{"004 runtime restarts, NOTREADY sandbox nobody collects", knobs{runtimeRestart: 2 * time.Minute}, testenv.Size(100, 40), [3]string{},
			func(f Faults) int { return f.StuckNotReady }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			hl := run(t, c.k, c.pods, c.pool, true)
			want := c.leaks(hl.Faults)
			if want == 0 {
				t.Fatalf("the knob injected no fault in %d pods: %+v", c.pods, hl.Faults)
			}
			if hl.LeakedAtEnd != want {
				t.Errorf("host-local leaked %d addresses; its incident leaks one per fault: %d", hl.LeakedAtEnd, want)
			}
			if hl.FalseReleases != 0 || hl.DoubleAssigned != 0 {
				t.Errorf("host-local: %d false releases, %d double assignments; the model should not cause either", hl.FalseReleases, hl.DoubleAssigned)
			}
			if c.k.crashloopers > 0 && hl.ExhaustionEvents == 0 {
				t.Errorf("host-local never ran out of its 32 addresses; the incident did")
			}
			ipl := run(t, c.k, c.pods, c.pool, false)
			if !ipl.Balanced() || ipl.ExhaustionEvents != 0 {
				t.Errorf("ipledger: leaked %d, false releases %d (%v), double %d, exhaustion %d; want all 0",
					ipl.LeakedAtEnd, ipl.FalseReleases, ipl.FalseReleaseOf, ipl.DoubleAssigned, ipl.ExhaustionEvents)
			}
			if c.leaks(ipl.Faults) == 0 {
				t.Errorf("ipledger's run met none of the faults: %+v", ipl.Faults)
			}
		})
	}
}

// The agent dies at random points (sometimes after committing an ADD whose answer is
// lost), DELs are spooled while it is down, and it restarts from its bbolt file.
func TestAgentCrash(t *testing.T) {
	r := run(t, knobs{agentCrash: 5 * time.Minute}, 400, [3]string{}, false)
	if r.Faults.AgentCrashes == 0 || r.Faults.SpooledDELs == 0 {
		t.Fatalf("no crash or no spooled DEL: %+v", r.Faults)
	}
	if !r.Balanced() {
		t.Errorf("ipledger after %d agent crashes: leaked %d, false %d, double %d", r.Faults.AgentCrashes, r.LeakedAtEnd, r.FalseReleases, r.DoubleAssigned)
	}
}

// The invariant checks can fail: releasing READY sandboxes' leases behind kubelet's
// back is counted as false releases, and handing their addresses out again as double
// assignments.
func TestInvariantChecksCatch(t *testing.T) {
	k := knobs{duration: 2 * time.Hour, fixedPods: 400}
	tmp := t.TempDir()
	w := newWorld(context.Background(), k, k.fixedPods, 7, tmp)
	b, err := newIpledger(w, filepath.Join(tmp, "ipledger"), crashPool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	w.b = b
	var victims int
	w.at(30*time.Minute, false, func() {
		for _, sb := range w.listed {
			if sb.state == sbReady {
				if _, ok, err := b.l.Release(ledger.Key{Network: network, ContainerID: sb.id, IfName: ifName}, ledger.ReasonManual, "test: behind kubelet's back"); err != nil || !ok {
					t.Errorf("release %s: %v %v", sb.id, ok, err)
				}
				victims++
			}
		}
	})
	if err := w.run(); err != nil {
		t.Fatal(err)
	}
	t.Logf("victims %d, false releases %d, double assigned %d", victims, w.c.falseReleases, w.c.doubleAssigned)
	if victims == 0 {
		t.Fatal("no READY sandbox at the injection time")
	}
	if w.c.falseReleases != victims {
		t.Errorf("false releases %d, want %d", w.c.falseReleases, victims)
	}
	if w.c.doubleAssigned == 0 {
		t.Errorf("the victims' addresses were handed out again while in use, but no double assignment was counted")
	}
}

// A seed replays the same run.
func TestDeterministic(t *testing.T) {
	k, _ := scenarioKnobs("mix")
	a := run(t, k, 600, [3]string{}, false)
	b := run(t, k, 600, [3]string{}, false)
	a.WallSeconds, b.WallSeconds = 0, 0
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if !bytes.Equal(ja, jb) {
		t.Errorf("two runs of one seed differ:\n%s\n%s", ja, jb)
	}
}

// `ipledgerctl sim -o json` prints one object per system and scenario with the
// contract's fields; bad flags name the flag and the fix.
func TestMain_JSONAndErrors(t *testing.T) {
	needHostLocal(t)
	var out, errb bytes.Buffer
	code := Main(context.Background(), []string{"--scenario", "second-sandbox", "--pods", "40", "--baseline-pods", "20", "-o", "json"}, &out, &errb, false)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var res []map[string]any
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if len(res) != 2 || res[0]["system"] != "ipledger" || res[1]["system"] != "host-local" {
		t.Fatalf("want ipledger then host-local: %s", out.String())
	}
	for _, f := range []string{"system", "scenario", "pods", "lifecycles", "leakedAtEnd", "falseReleases", "doubleAssigned", "exhaustionEvents", "peakLive", "reclaimSecondsP50", "reclaimSecondsP99", "wallSeconds"} {
		if _, ok := res[0][f]; !ok {
			t.Errorf("field %q missing: %s", f, out.String())
		}
	}
	if res[1]["pods"].(float64) != 20 || !strings.Contains(res[1]["note"].(string), "20 of 40") {
		t.Errorf("baseline pod count not capped or not said: %v", res[1])
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--scenario", "nope"}, "--scenario"},
		{[]string{"--pool", "10.1.2.3/16"}, "--pool"},
		{[]string{"--pods", "0"}, "--pods"},
		{[]string{"-o", "yaml"}, "-o"},
	} {
		errb.Reset()
		if code := Main(context.Background(), c.args, &out, &errb, false); code != 2 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming %s", c.args, code, errb.String(), c.want)
		}
	}
}

// BenchmarkMix100k is the figure of the issue: a 100,000-pod mix on ipledger alone.
// go test -run '^$' -bench Mix100k -benchtime 1x ./internal/sim
func BenchmarkMix100k(b *testing.B) {
	for b.Loop() {
		res, err := Run(context.Background(), Options{Scenario: "mix", Pods: 100000, Seed: 1, TempDir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(res[0].Lifecycles), "lifecycles")
		b.ReportMetric(float64(res[0].Lifecycles)/res[0].WallSeconds, "lifecycles/s")
		b.ReportMetric(float64(res[0].LeakedAtEnd), "leaked")
	}
}

// Every fault at once, wall-clock steps included, small: ipledger ends balanced.
func TestMixBalanced(t *testing.T) {
	k, _ := scenarioKnobs("mix")
	r := run(t, k, 800, [3]string{}, false)
	if !r.Balanced() || r.ExhaustionEvents != 0 {
		t.Errorf("ipledger: leaked %d, false %d (%v), double %d, exhaustion %d", r.LeakedAtEnd, r.FalseReleases, r.FalseReleaseOf, r.DoubleAssigned, r.ExhaustionEvents)
	}
}

// TestReservationsRespected: with a reservation covering the addresses the pool
// hands out first, no ADD of the mix scenario is answered with a reserved address,
// and the books still balance (ipledger's ipam.exclude, through the real plugin and
// agent).
func TestReservationsRespected(t *testing.T) {
	for _, tc := range []struct {
		family, pool string
		reserve      []string
	}{
		{"IPv4", "10.70.0.0/24", []string{"10.70.0.0/26", "10.70.0.77"}},
		{"IPv6", "fd00:70::/120", []string{"fd00:70::/122", "fd00:70::4d"}},
	} {
		t.Run(tc.family, func(t *testing.T) {
			res, err := Run(context.Background(), Options{Scenario: "mix", Pods: 800, Seed: 3, Pool: tc.pool,
				Reserve: tc.reserve, TempDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			if len(res) != 1 {
				t.Fatalf("%d results, want ipledger's alone", len(res))
			}
			r := res[0]
			t.Logf("%d pods, %d lifecycles, peak live %d, reserved hits %d", r.Pods, r.Lifecycles, r.PeakLive, r.ReservedHits)
			if r.ReservedHits != 0 || !r.Balanced() {
				t.Errorf("reserved hits %d, leaked %d, false %d, double %d", r.ReservedHits, r.LeakedAtEnd, r.FalseReleases, r.DoubleAssigned)
			}
		})
	}
	if _, err := Run(context.Background(), Options{Scenario: "mix", Pods: 1, Reserve: []string{"10.70.0.5/24"}}); err == nil || !strings.Contains(err.Error(), "--reserve") {
		t.Errorf("a reservation with host bits: %v, want an error naming --reserve", err)
	}
}
