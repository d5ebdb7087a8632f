package bench_test

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/bench"
)

type tlog struct{ t *testing.T }

func (w tlog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestSmoke runs the harness with small counts and checks that the report is well
// formed: every group measured, every number finite and positive, comparisons where
// there is a baseline, and Markdown with the machine and every row. It asserts no
// timing.
func TestSmoke(t *testing.T) {
	log := slog.New(slog.NewTextHandler(tlog{t}, nil))
	rep, err := bench.Run(context.Background(), bench.Options{Smoke: true, TB: t, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]int{}
	for _, r := range rep.Rows {
		groups[r.Group]++
		if !(r.IPledger > 0) || math.IsInf(r.IPledger, 0) {
			t.Errorf("row %s / %s: ipledger value %v", r.Group, r.Name, r.IPledger)
		}
		for _, v := range []float64{r.Baseline, r.Floor} {
			if !math.IsNaN(v) && (!(v > 0) || math.IsInf(v, 0)) {
				t.Errorf("row %s / %s: comparison value %v", r.Group, r.Name, v)
			}
		}
		if r.Unit == "" || r.Name == "" {
			t.Errorf("row %+v: no name or unit", r)
		}
	}
	for g, want := range map[string]int{
		"IPAM exec":                12, // ADD and DEL, p50 and p99, at 0, 50, 95%
		"Burst of concurrent ADDs": 2,
		"Main plugin, real netns":  6,
		"In-process":               11,
		"Plugin binary":            4,
	} {
		if groups[g] < want {
			t.Errorf("group %q: %d rows, want at least %d", g, groups[g], want)
		}
	}
	for _, r := range rep.Rows {
		if r.Group == "In-process" || strings.Contains(r.Name, "size") {
			continue
		}
		if math.IsNaN(r.VsBaseline()) || math.IsNaN(r.VsFloor()) {
			t.Errorf("row %s / %s: no ratio to the baseline or the floor", r.Group, r.Name)
		}
	}
	if len(rep.Targets) < 5 {
		t.Errorf("%d goals evaluated, want at least 5: %+v", len(rep.Targets), rep.Targets)
	}
	var md bytes.Buffer
	if err := rep.Markdown(&md); err != nil {
		t.Fatal(err)
	}
	out := md.String()
	for _, want := range []string{"# ipledger benchmark", rep.Machine.Kernel, "| Group | Measurement | ipledger | baseline | floor | ipledger / baseline | ipledger / floor |", "## Goals"} {
		if !strings.Contains(out, want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
	for _, r := range rep.Rows {
		if !strings.Contains(out, "| "+r.Group+" | "+r.Name+" |") {
			t.Errorf("markdown lacks row %s / %s", r.Group, r.Name)
		}
	}
	t.Logf("report:\n%s", out)
}
