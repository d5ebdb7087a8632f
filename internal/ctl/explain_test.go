package ctl_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ctl"
)

// TestExplain: each kind of finding is explained in plain words with its likely cause,
// naming the pod and the address. The inputs are what the agent answers (the real
// agent's answers are checked in TestCommandOutputs and the runtime tests).
func TestExplain(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC)
	lease := func(cid, name, uid, sandbox, verdict, suspect string, age time.Duration, ip string) api.LeaseView {
		return api.LeaseView{Network: "k8s", ContainerID: cid, IfName: "eth0", IPs: []string{ip}, Namespace: "default", Name: name, UID: uid,
			Created: now.Add(-age), Sandbox: sandbox, Verdict: verdict, Suspect: suspect}
	}
	for _, tc := range []struct {
		name   string
		audit  api.Audit
		leases []api.LeaseView
		kind   string
		want   []string
	}{
		{"stranded", api.Audit{}, []api.LeaseView{lease("sb1", "web-1", "u1", "NOTREADY", api.VerdictStranded, "stranded: sandbox NOTREADY and address configured in netns for 3h", 3*time.Hour, "10.0.0.5/24")},
			api.VerdictStranded, []string{"stranded: pod default/web-1's sandbox sb1 is NotReady (lease 3h old) and its namespace still holds 10.0.0.5/24", "a chained plugin's teardown probably failed", "--reclaim-stranded"}},
		{"leaked gone", api.Audit{}, []api.LeaseView{lease("sb2", "job-7", "u2", "GONE", api.VerdictLeaked, "sandbox gone from the runtime, netns gone", 20*time.Minute, "10.0.0.6/24")},
			api.VerdictLeaked, []string{"leaked: pod default/job-7's sandbox sb2 is gone from the runtime", "no longer holds 10.0.0.6/24", "without a DEL that reached ipledger", "releases it after the release grace"}},
		{"leaked notready", api.Audit{}, []api.LeaseView{lease("sb3", "job-8", "u3", "NOTREADY", api.VerdictLeaked, "x", time.Hour, "10.0.0.7/24")},
			api.VerdictLeaked, []string{"leaked: pod default/job-8's sandbox sb3 is NotReady and its namespace no longer holds 10.0.0.7/24"}},
		{"suspect", api.Audit{}, []api.LeaseView{lease("sb4", "db-0", "u4", "NOTREADY", api.VerdictSuspect, "x", time.Hour, "10.0.0.8/24")},
			api.VerdictSuspect, []string{"suspect: pod default/db-0's sandbox sb4 is notready and no network namespace was recorded"}},
		{"suspect, netns not visible", api.Audit{}, []api.LeaseView{lease("sb5", "db-1", "u6", "NOTREADY", api.VerdictSuspect, "sandbox NOTREADY, netns directory not visible: cannot verify, kept for 1m, 3 observations", time.Hour, "10.0.0.12/24")},
			api.VerdictSuspect, []string{"suspect: pod default/db-1's sandbox sb5 is notready and the agent cannot see its network namespace and nothing shows it gone", "mount the runtime's netns directory (the host's /run/netns or /var/run/netns) into the agent with mountPropagation: HostToContainer"}},
		{"two leases", api.Audit{}, []api.LeaseView{lease("old", "web-1", "u5", "NOTREADY", "", "", 2*time.Hour, "10.0.0.9/24"), lease("new", "web-1", "u5", "READY", "", "", time.Minute, "10.0.0.10/24")},
			"two-leases", []string{"pod default/web-1 holds two leases on k8s", "10.0.0.9/24 since 2h (sandbox old, notready); 10.0.0.10/24 since 60s (sandbox new, ready)", "its sandbox was re-created without a DEL for the old one"}},
		{"double", api.Audit{Doubles: []api.DoubleAssigned{{Network: "k8s", IP: netip.MustParseAddr("10.0.0.11"), Holders: []api.Key{{Network: "k8s", ContainerID: "a", IfName: "eth0"}, {Network: "k8s", ContainerID: "b", IfName: "eth0"}}}}}, nil,
			"double-assigned", []string{"double-assigned: k8s/10.0.0.11 is held by k8s/a/eth0 and k8s/b/eth0"}},
		{"runtime", api.Audit{Runtime: "unreachable"}, nil, "runtime", []string{"runtime unreachable", "nothing is released by reconciliation until it answers"}},
		{"books", api.Audit{Problems: []string{`pool "k8s" does not balance`}}, nil, "books", []string{`books: pool "k8s" does not balance`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ex := ctl.Explain(&tc.audit, tc.leases, now)
			if len(ex) != 1 || ex[0].Kind != tc.kind {
				t.Fatalf("got %+v, want one %s finding", ex, tc.kind)
			}
			for _, w := range tc.want {
				if !strings.Contains(ex[0].Text, w) {
					t.Errorf("explanation lacks %q:\n%s", w, ex[0].Text)
				}
			}
		})
	}
	if ex := ctl.Explain(&api.Audit{}, []api.LeaseView{lease("ok", "fine", "u9", "READY", "", "", time.Hour, "10.0.0.2/24")}, now); len(ex) != 0 {
		t.Fatalf("a healthy lease explained: %+v", ex)
	}
}
