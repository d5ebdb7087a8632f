package ctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ctl"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
)

// knownLedger starts a real agent and brings its ledger to a known state: network
// n1 with web-0 (eth0) and web-1 (eth0) live and old-0 released by DEL (10.90.0.2 is
// then cooling and has one history entry); network n2 with a bare attachment.
func knownLedger(t *testing.T) *agentenv.Agent {
	t.Helper()
	a := agentenv.Start(t, agentenv.Options{Args: []string{"--reuse-delay", "1h"}})
	n1 := ledgertest.Ranges(t, `[[{"subnet":"10.90.0.0/24"}]]`)
	n2 := ledgertest.Ranges(t, `[[{"subnet":"10.91.0.0/28"}],[{"subnet":"fd91::/120"}]]`)
	for _, r := range []api.Request{
		{Op: api.OpAdd, Network: "n1", ContainerID: "old-0", IfName: "eth0", Ranges: n1, Pod: api.Pod{Namespace: "ns1", Name: "old-0", UID: "uid-0"}},
		{Op: api.OpAdd, Network: "n1", ContainerID: "web-0", IfName: "eth0", Ranges: n1, Pod: api.Pod{Namespace: "ns1", Name: "web-0", UID: "uid-1"}, NetNS: api.NetNS{Path: "/run/netns/web-0"}},
		{Op: api.OpAdd, Network: "n1", ContainerID: "web-1", IfName: "eth0", Ranges: n1, Pod: api.Pod{Namespace: "ns2", Name: "web-1", UID: "uid-2"}},
		{Op: api.OpDel, Network: "n1", ContainerID: "old-0", IfName: "eth0", Detail: "pod deleted"},
		{Op: api.OpAdd, Network: "n2", ContainerID: "bare", IfName: "net1", Ranges: n2},
	} {
		if _, err := a.Call(r); err != nil {
			t.Fatalf("%s %s: %v", r.Op, r.ContainerID, err)
		}
	}
	return a
}

// runCtl runs ipledgerctl in process against the agent, with the clock at now.
func runCtl(t *testing.T, a *agentenv.Agent, now time.Time, args ...string) (string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	env := &ctl.Env{Stdout: &out, Stderr: &errOut, Call: api.Call, Now: func() time.Time { return now }}
	code := ctl.Main(env, append([]string{"--socket", a.Socket}, args...))
	if errOut.Len() > 0 {
		t.Logf("ipledgerctl %v stderr: %s", args, errOut.String())
	}
	return out.String(), code
}

// TestCommandOutputs checks each reading command's table, JSON and YAML output on a
// ledger in a known state, the leases filters, and that YAML and JSON carry the same
// objects.
func TestCommandOutputs(t *testing.T) {
	a := knownLedger(t)
	var views []api.LeaseView
	out, code := runCtl(t, a, time.Now(), "leases", "-o", "json")
	if err := json.Unmarshal([]byte(out), &views); err != nil || code != 0 || len(views) != 3 {
		t.Fatalf("leases -o json: exit %d, %v: %s", code, err, out)
	}
	newest := views[0].Created
	for _, v := range views {
		if v.Created.After(newest) {
			newest = v.Created
		}
	}
	now := newest.Add(3*time.Hour + 30*time.Second) // every lease is 3h old, to the minute

	t.Run("leases table", func(t *testing.T) {
		out, code := runCtl(t, a, now, "leases")
		want := []string{
			"NETWORK  CONTAINER  IFNAME  IPS                       POD        PHASE  AGE  SANDBOX  VERDICT  WHY",
			"n1       web-0      eth0    10.90.0.3/24              ns1/web-0  -      3h   -        -        default pool",
			"n1       web-1      eth0    10.90.0.4/24              ns2/web-1  -      3h   -        -        default pool",
			"n2       bare       net1    10.91.0.2/28,fd91::2/120  -          -      3h   -        -        default pool",
		}
		if code != 0 || strings.TrimRight(out, "\n") != strings.Join(want, "\n") {
			t.Fatalf("exit %d\n%s\nwant\n%s", code, out, strings.Join(want, "\n"))
		}
	})
	t.Run("filters", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want []string // container IDs
		}{
			{[]string{"--network", "n1"}, []string{"web-0", "web-1"}},
			{[]string{"--network", "n2"}, []string{"bare"}},
			{[]string{"--pod", "ns2/web-1"}, []string{"web-1"}},
			{[]string{"--pod", "web-0"}, []string{"web-0"}},
			{[]string{"--pod", "uid-2"}, []string{"web-1"}},
			{[]string{"--pod", "ns1/web-1"}, []string{}},
			{[]string{"--network", "n2", "--pod", "web-0"}, []string{}},
		} {
			out, code := runCtl(t, a, now, append([]string{"leases", "-o", "json"}, tc.args...)...)
			var got []api.LeaseView
			if err := json.Unmarshal([]byte(out), &got); err != nil || code != 0 {
				t.Fatalf("%v: exit %d, %v: %s", tc.args, code, err, out)
			}
			ids := []string{}
			for _, v := range got {
				ids = append(ids, v.ContainerID)
			}
			if !reflect.DeepEqual(ids, tc.want) {
				t.Errorf("leases %v: %v, want %v", tc.args, ids, tc.want)
			}
		}
	})
	t.Run("leases yaml", func(t *testing.T) {
		out, code := runCtl(t, a, now, "leases", "-o", "yaml")
		var fromYAML []api.LeaseView
		if err := yaml.Unmarshal([]byte(out), &fromYAML); err != nil || code != 0 {
			t.Fatalf("exit %d, %v:\n%s", code, err, out)
		}
		if !reflect.DeepEqual(fromYAML, views) {
			t.Fatalf("YAML holds other leases than JSON:\n%s", out)
		}
		for _, key := range []string{"- containerID: web-0", "  network: n1", "  namespace: ns1", "  name: web-0", "  uid: uid-1", "  netns: /run/netns/web-0", "  - 10.91.0.2/28"} {
			if !strings.Contains(out, key+"\n") {
				t.Errorf("YAML lacks %q:\n%s", key, out)
			}
		}
	})
	t.Run("audit", func(t *testing.T) {
		out, code := runCtl(t, a, now, "audit")
		if code != 0 || !strings.HasPrefix(out, "BALANCED: live 3, suspect 0, stranded 0, leaked 0, double-assigned 0 (runtime: none)\n") ||
			!strings.Contains(out, "  pool n1: 3 allocations = 1 releases + 2 live; 1 free\n") ||
			!strings.Contains(out, "  pool n2: 2 allocations = 0 releases + 2 live; 0 free\n") {
			t.Fatalf("audit table: exit %d\n%s", code, out)
		}
		for _, format := range []string{"json", "yaml"} {
			out, code := runCtl(t, a, now, "audit", "-o", format)
			var m map[string]any
			if err := yaml.Unmarshal([]byte(out), &m); err != nil || code != 0 { // YAML is a superset of JSON
				t.Fatalf("audit -o %s: exit %d, %v\n%s", format, code, err, out)
			}
			hasKeys(t, "audit -o "+format, m, "live", "suspect", "leaked", "doubleAssigned", "explanations", "pools")
			if m["live"] != 3.0 || m["ok"] != true {
				t.Errorf("audit -o %s: %v", format, m)
			}
		}
	})
	t.Run("history", func(t *testing.T) {
		out, code := runCtl(t, a, now, "history", "--network", "n1", "--ip", "10.90.0.2")
		lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
		if code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], "FROM ") ||
			!strings.Contains(lines[1], " old-0 ") || !strings.Contains(lines[1], " ns1/old-0 ") || !strings.Contains(lines[1], "DEL     pod deleted  ") ||
			!strings.HasSuffix(lines[0], " WHY") || !strings.HasSuffix(lines[1], " default pool") {
			t.Fatalf("history table: exit %d\n%s", code, out)
		}
		for _, format := range []string{"json", "yaml"} {
			out, code := runCtl(t, a, now, "history", "--network", "n1", "--ip", "10.90.0.2", "-o", format)
			var h []ledger.Release
			if err := yaml.Unmarshal([]byte(out), &h); err != nil || code != 0 || len(h) != 1 || h[0].Reason != ledger.ReasonDEL || h[0].Key.ContainerID != "old-0" || h[0].Detail != "pod deleted" {
				t.Fatalf("history -o %s: exit %d, %v: %s", format, code, err, out)
			}
		}
	})
	t.Run("pools", func(t *testing.T) {
		out, code := runCtl(t, a, now, "pools")
		want := "NETWORK  LIVE  FREE  ALLOCATIONS  RELEASES  DRAINED\nn1       2     1     3            1         -\nn2       2     0     2            0         -\n"
		if code != 0 || out != want {
			t.Fatalf("pools: exit %d\n%s\nwant\n%s", code, out, want)
		}
		for _, format := range []string{"json", "yaml"} {
			out, code := runCtl(t, a, now, "pools", "-o", format)
			var ps []ledger.PoolAudit
			if err := yaml.Unmarshal([]byte(out), &ps); err != nil || code != 0 || len(ps) != 2 || ps[0].Network != "n1" || ps[0].Live != 2 || ps[1].Live != 2 {
				t.Fatalf("pools -o %s: exit %d, %v: %s", format, code, err, out)
			}
		}
	})
}

func TestAge(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"}, {42 * time.Second, "42s"}, {119 * time.Second, "119s"}, {5 * time.Minute, "5m"},
		{3 * time.Hour, "3h"}, {3*time.Hour + 12*time.Minute, "3h12m"}, {30 * time.Hour, "30h"}, {100 * time.Hour, "4d"},
	} {
		if got := ctl.Age(tc.d); got != tc.want {
			t.Errorf("Age(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

// The leases table says why an address was chosen, as the lease records it.
func TestLeaseRowWhy(t *testing.T) {
	now := time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC)
	v := api.LeaseView{Network: "net", ContainerID: "abc", IfName: "eth0", IPs: []string{"10.96.0.5/24"}, Namespace: "default", Name: "web-0",
		Created: now.Add(-time.Minute), Why: "sticky for web-0, borrowed from node node2"}
	row := strings.Split(ctl.LeaseRow(v, now), "\t")
	head := strings.Split(ctl.LeaseHeader, "\t")
	if len(row) != len(head) || head[len(head)-1] != "WHY" || row[len(row)-1] != v.Why {
		t.Fatalf("row %q under header %q: want the why %q in the WHY column", row, head, v.Why)
	}
}

// TestPoolsDraining: in cluster mode `ipledgerctl pools` shows each pool's
// drained ranges in the DRAINED column and, below the table, each draining block
// with the leases and pods that still hold it; -o json and -o yaml carry the same
// fields (drained, draining: block, leases, pods, rangeInPool); a block whose
// range is back in the pool says so.
func TestPoolsDraining(t *testing.T) {
	audit := &api.Audit{OK: true, Runtime: "none", Pools: []api.PoolAudit{
		{Network: "pods", Allocations: 5, Releases: 2, Live: 3, Free: 1, Drained: []string{"10.60.0.0/27"},
			Draining: []api.DrainingBlock{{Block: "10.60.0.0/29", Leases: 2, Pods: []string{"default/web-0", "shop/api-1"}}, {Block: "10.60.0.8/29", Pods: []string{}}}},
		{Network: "blue", Allocations: 1, Live: 1,
			Draining: []api.DrainingBlock{{Block: "10.61.0.0/29", Leases: 1, Pods: []string{"team-b/db-0"}, RangeInPool: true}}},
	}}
	call := func(_ context.Context, _ string, req api.Request) (*api.Response, error) {
		if req.Op != api.OpAudit {
			return nil, fmt.Errorf("unexpected op %q", req.Op)
		}
		return &api.Response{Version: api.Version, Audit: audit}, nil
	}
	run := func(args ...string) (string, int) {
		var out, errOut bytes.Buffer
		code := ctl.Main(&ctl.Env{Stdout: &out, Stderr: &errOut, Call: call, Now: time.Now}, append([]string{"--socket", "/nowhere"}, args...))
		if errOut.Len() > 0 {
			t.Logf("stderr: %s", errOut.String())
		}
		return out.String(), code
	}
	out, code := run("pools")
	want := "NETWORK  LIVE  FREE  ALLOCATIONS  RELEASES  DRAINED\n" +
		"blue     1     0     1            0         -\n" +
		"pods     3     1     5            2         10.60.0.0/27\n" +
		"blue: block 10.61.0.0/29 draining (its range is back in the pool; claimable again once given back), held by 1 leases: team-b/db-0\n" +
		"pods: block 10.60.0.0/29 draining, held by 2 leases: default/web-0, shop/api-1\n" +
		"pods: block 10.60.0.8/29 draining, held by nothing: given back once the reuse delay has passed since its last release\n"
	if code != 0 || out != want {
		t.Fatalf("pools: exit %d\n%s\nwant\n%s", code, out, want)
	}
	for _, format := range []string{"json", "yaml"} {
		out, code := run("pools", "-o", format)
		var ps []api.PoolAudit
		if err := yaml.Unmarshal([]byte(out), &ps); err != nil || code != 0 || len(ps) != 2 {
			t.Fatalf("pools -o %s: exit %d, %v: %s", format, code, err, out)
		}
		if p := ps[1]; p.Network != "pods" || !slices.Equal(p.Drained, []string{"10.60.0.0/27"}) || len(p.Draining) != 2 ||
			p.Draining[0].Block != "10.60.0.0/29" || p.Draining[0].Leases != 2 || !slices.Equal(p.Draining[0].Pods, []string{"default/web-0", "shop/api-1"}) {
			t.Fatalf("pools -o %s: %+v", format, p)
		}
		if p := ps[0]; p.Network != "blue" || len(p.Draining) != 1 || !p.Draining[0].RangeInPool || p.Draining[0].Pods[0] != "team-b/db-0" {
			t.Fatalf("pools -o %s: %+v, want blue's block 10.61.0.0/29 draining with its range back in the pool", format, p)
		}
	}
}
