package ctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ctl"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
)

// ctlRun runs the real ipledgerctl binary against the agent on socket.
func ctlRun(t *testing.T, socket string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return agentenv.Ctl(t, append([]string{"--socket", socket}, args...)...)
}

func hasKeys(t *testing.T, what string, m map[string]any, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			t.Errorf("%s lacks %q: %v", what, k, m)
		}
	}
}

// TestLeasesAndAuditJSON checks `leases -o json` and `audit -o json` against the
// contract in DESIGN.md, on a real agent.
func TestLeasesAndAuditJSON(t *testing.T) {
	a := agentenv.Start(t, agentenv.Options{})
	out, _, code := ctlRun(t, a.Socket, "leases", "-o", "json")
	if code != 0 || strings.TrimSpace(out) != "[]" {
		t.Fatalf("leases of an empty ledger: exit %d, %q; want [] and 0", code, out)
	}
	sets := ledgertest.Ranges(t, `[[{"subnet":"10.90.0.0/24"}],[{"subnet":"fd90::/64"}]]`)
	for _, r := range []api.Request{
		{Op: api.OpAdd, Network: "n1", ContainerID: "withpod", IfName: "eth0", Ranges: sets, Pod: api.Pod{Namespace: "ns1", Name: "web-0", UID: "uid-1"}},
		{Op: api.OpAdd, Network: "n1", ContainerID: "bare", IfName: "net1", Ranges: sets},
	} {
		if _, err := a.Call(r); err != nil {
			t.Fatal(err)
		}
	}
	out, _, code = ctlRun(t, a.Socket, "leases", "-o", "json")
	var leases []map[string]any
	if err := json.Unmarshal([]byte(out), &leases); err != nil || code != 0 {
		t.Fatalf("leases: exit %d, %v: %s", code, err, out)
	}
	if len(leases) != 2 {
		t.Fatalf("want 2 leases: %s", out)
	}
	for _, l := range leases {
		hasKeys(t, "lease", l, "network", "containerID", "ifname", "ips")
		ips, _ := l["ips"].([]any)
		if len(ips) != 2 {
			t.Fatalf("lease %v: want two ips", l)
		}
		for _, ip := range ips {
			if s, _ := ip.(string); func() error { _, err := netip.ParsePrefix(s); return err }() != nil {
				t.Fatalf("ips holds %v, not a CIDR string", ip)
			}
		}
		switch l["containerID"] {
		case "withpod":
			if l["namespace"] != "ns1" || l["name"] != "web-0" || l["uid"] != "uid-1" || l["ifname"] != "eth0" || l["network"] != "n1" {
				t.Fatalf("lease with pod: %v", l)
			}
		case "bare":
			if l["ifname"] != "net1" {
				t.Fatalf("lease: %v", l)
			}
		default:
			t.Fatalf("unexpected lease %v", l)
		}
	}

	out, _, code = ctlRun(t, a.Socket, "audit", "-o", "json")
	var audit map[string]any
	if err := json.Unmarshal([]byte(out), &audit); err != nil {
		t.Fatalf("audit: %v: %s", err, out)
	}
	hasKeys(t, "audit", audit, "live", "suspect", "leaked", "doubleAssigned")
	if code != 0 || audit["live"] != 2.0 || audit["doubleAssigned"] != 0.0 || audit["leaked"] != 0.0 {
		t.Fatalf("audit of a balanced ledger: exit %d, %s", code, out)
	}
}

// TestSocketMissingExits2: every command reading the agent exits 2 and names the
// socket when it is missing, and prints nothing on stdout.
func TestSocketMissingExits2(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "missing.sock")
	for _, args := range [][]string{
		{"leases", "-o", "json"}, {"audit", "-o", "json"}, {"audit"}, {"pools", "-o", "json"},
		{"history", "--network", "n", "--ip", "10.0.0.1", "-o", "json"},
		{"release", "--network", "n", "--container-id", "c"}, {"leases", "-o", "yaml"},
	} {
		out, errOut, code := ctlRun(t, sock, args...)
		if code != 2 || out != "" || !strings.Contains(errOut, sock) {
			t.Errorf("%v without an agent: exit %d, stdout %q, stderr %q; want 2, nothing, the socket named", args, code, out, errOut)
		}
	}
	// usage errors are 2 as well
	if _, _, code := ctlRun(t, sock, "audit", "-o", "xml"); code != 2 {
		t.Errorf("audit -o xml: exit %d, want 2", code)
	}
	if _, _, code := ctlRun(t, sock, "frobnicate"); code != 2 {
		t.Errorf("unknown command: exit %d, want 2", code)
	}
}

// TestAuditExitStatus: 0 balanced, 1 not, 2 on error, whatever the output format. A
// fake agent gives the unbalanced verdict, which a real agent cannot be made to give
// without breaking its ledger (TestLeasesAndAuditJSON covers the real one).
func TestAuditExitStatus(t *testing.T) {
	for _, tc := range []struct {
		name string
		resp *api.Response
		err  error
		want int
	}{
		{"balanced", &api.Response{Audit: &api.Audit{OK: true, Live: 3}}, nil, ctl.ExitOK},
		{"unbalanced", &api.Response{Audit: &api.Audit{OK: false, Live: 3, DoubleAssigned: 1}}, nil, ctl.ExitUnbalanced},
		{"leaked", &api.Response{Audit: &api.Audit{OK: false, Leaked: 1}}, nil, ctl.ExitUnbalanced},
		{"agent error", nil, &api.Error{Code: api.CodeStore, Msg: "disk on fire"}, ctl.ExitError},
		{"no audit in answer", &api.Response{}, nil, ctl.ExitError},
		{"unreachable", nil, api.ErrUnreachable, ctl.ExitError},
	} {
		for _, format := range []string{"json", "table"} {
			t.Run(tc.name+"/"+format, func(t *testing.T) {
				var out, errOut bytes.Buffer
				env := &ctl.Env{Stdout: &out, Stderr: &errOut, Call: func(context.Context, string, api.Request) (*api.Response, error) {
					return tc.resp, tc.err
				}}
				if code := ctl.Main(env, []string{"audit", "-o", format}); code != tc.want {
					t.Fatalf("exit %d, want %d (stdout %q, stderr %q)", code, tc.want, out.String(), errOut.String())
				}
				if tc.want != ctl.ExitError && format == "json" {
					var m map[string]any
					if err := json.Unmarshal(out.Bytes(), &m); err != nil {
						t.Fatalf("not JSON: %q", out.String())
					}
					hasKeys(t, "audit", m, "live", "suspect", "leaked", "doubleAssigned")
				}
			})
		}
	}
}
