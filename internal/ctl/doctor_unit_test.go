package ctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ctl"
)

// TestDoctorVerdicts: each finding of the agent's diagnosis becomes its line and the
// exit status is the worst line's. The agent's answers are given here, for findings a
// real agent reaches only after hours (a NotReady sandbox older than an hour) or by
// breaking it (unbalanced books); TestDoctor and TestOperatorSurfaceOnRealRuntime run
// doctor against real agents.
func TestDoctorVerdicts(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	healthy := func() *api.Diagnosis {
		return &api.Diagnosis{Runtime: "ok", RuntimeVersion: "containerd 1.6.20", BooksBalanced: true, Now: now,
			Pools: []api.PoolUse{{Network: "k8s", Usable: 254, InUse: 10, MostUsed: 10.0 / 254}}}
	}
	for _, tc := range []struct {
		name   string
		change func(d *api.Diagnosis)
		want   int
		line   string
	}{
		{"healthy", func(*api.Diagnosis) {}, 0, "OK   runtime reachable: containerd 1.6.20"},
		{"old NotReady", func(d *api.Diagnosis) {
			d.NotReady = []api.SandboxAge{{ID: "young", Created: now.Add(-time.Minute)}, {ID: "old", Namespace: "default", Name: "web-0", Created: now.Add(-3 * time.Hour)}}
		}, 1, "WARN 1 NotReady sandboxes older than 1h0m0s: default/web-0 (old) for 3h"},
		{"runtime down", func(d *api.Diagnosis) { d.Runtime, d.RuntimeError = "unreachable", "connection refused" }, 2, "FAIL runtime unreachable: connection refused"},
		{"spool backlog", func(d *api.Diagnosis) { d.SpoolBacklog = 3 }, 1, "WARN spool backlog: 3 DELs waiting"},
		{"books", func(d *api.Diagnosis) { d.BooksBalanced, d.Problems = false, []string{"pool k8s does not balance"} }, 2, "FAIL books NOT balanced: pool k8s does not balance"},
		{"clock", func(d *api.Diagnosis) { d.ClockSteps, d.LastStep = 2, "-1h0m0s at 2026-03-01T11:00:00Z" }, 1, "WARN wall clock stepped 2 times"},
		{"near exhaustion", func(d *api.Diagnosis) { d.Pools[0].MostUsed = 0.95 }, 1, "WARN pool k8s within 10% of exhaustion: 95%"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := healthy()
			tc.change(d)
			var out, errOut bytes.Buffer
			env := &ctl.Env{Stdout: &out, Stderr: &errOut,
				Call: func(context.Context, string, api.Request) (*api.Response, error) {
					return &api.Response{Doctor: d}, nil
				},
				Loopback: func(string) (bool, error) { return true, nil }}
			code := ctl.Main(env, []string{"doctor"})
			if code != tc.want || !strings.Contains(out.String(), tc.line) {
				t.Fatalf("exit %d, want %d; want a line %q:\n%s", code, tc.want, tc.line, out.String())
			}
		})
	}
}

// TestDoctorJSON: `doctor -o json` prints the same checks as the table, and the worst
// level, with the table's exit status.
func TestDoctorJSON(t *testing.T) {
	d := &api.Diagnosis{Runtime: "ok", RuntimeVersion: "containerd 1.6.20", BooksBalanced: true, SpoolBacklog: 2}
	var out, errOut bytes.Buffer
	env := &ctl.Env{Stdout: &out, Stderr: &errOut,
		Call: func(context.Context, string, api.Request) (*api.Response, error) {
			return &api.Response{Doctor: d}, nil
		},
		Loopback: func(string) (bool, error) { return true, nil }}
	code := ctl.Main(env, []string{"doctor", "-o", "json"})
	var got ctl.DoctorOutput
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v:\n%s", err, out.String())
	}
	if code != 1 || got.Level != ctl.LevelWarn {
		t.Fatalf("exit %d level %q, want 1 and WARN:\n%s", code, got.Level, out.String())
	}
	var table bytes.Buffer
	env.Stdout = &table
	ctl.Main(env, []string{"doctor"})
	lines := strings.Split(strings.TrimSpace(table.String()), "\n")
	if len(lines) != len(got.Checks) {
		t.Fatalf("%d checks in json, %d lines in the table:\n%s", len(got.Checks), len(lines), table.String())
	}
	for i, c := range got.Checks {
		if want := fmt.Sprintf("%-4s %s", c.Level, c.Text); lines[i] != want {
			t.Errorf("line %d: %q, json %q", i, lines[i], want)
		}
	}
}
