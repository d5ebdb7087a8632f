package cluster_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
)

// doctorRun runs the real `ipledgerctl doctor` and returns its lines and exit status,
// checking the contract: every line starts with OK, WARN or FAIL, and the exit status
// is the worst level's (0, 1, 2).
func doctorRun(t *testing.T, socket string) ([]string, int) {
	t.Helper()
	// the loopback of the namespace ipledgerctl runs in (the test's): /proc/1's may
	// be out of reach in a sandbox
	out, errOut, code := agentenv.Ctl(t, "--socket", socket, "doctor", "--netns", "/proc/self/ns/net")
	t.Logf("doctor (exit %d):\n%s%s", code, out, errOut)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	worst := 0
	for _, l := range lines {
		switch f, _, _ := strings.Cut(l, " "); f {
		case "OK":
		case "WARN":
			worst = max(worst, 1)
		case "FAIL":
			worst = max(worst, 2)
		default:
			t.Errorf("doctor line does not start with OK, WARN or FAIL: %q", l)
		}
	}
	if code != worst {
		t.Errorf("doctor exit %d, want %d (its worst line)", code, worst)
	}
	return lines, code
}

// lineWith returns the one line containing s, or "".
func lineWith(lines []string, s string) string {
	for _, l := range lines {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// TestDoctorClusterMode: the real `ipledgerctl doctor` against a real ipledgerd in
// cluster mode on embedded etcd: all OK (datastore reachable, node lease provable
// with the time left, the network's block and free addresses, no lease in a lost
// block), so only the missing runtime WARNs (exit 1); with etcd stopped past the 3 s
// lease, the node lease and the datastore FAIL with their fixes and the exit status is
// 2; with etcd back, exit 1 again.
func TestDoctorClusterMode(t *testing.T) {
	sideBySideWhenShort(t)
	e := etcdenv.StartEmbedded(t)
	n := startNodes(t, 1, []string{"--datastore", "etcd", "--etcd-endpoints", strings.Join(e.Endpoints(), ",")})[0]
	if _, err := call(n, api.Request{Op: api.OpAdd, Network: network, ContainerID: "c1", IfName: "eth0", Ranges: ranges(t)}); err != nil {
		t.Fatal(err)
	}
	// healthy: every line OK but the runtime's (the agent runs without
	// --cri-endpoint here), so exit 1
	lines, code := doctorRun(t, n.Socket)
	for _, l := range lines {
		if !strings.HasPrefix(l, "OK") && !strings.HasPrefix(l, "WARN no runtime configured") {
			t.Errorf("healthy cluster-mode node: %q", l)
		}
	}
	if code != 1 {
		t.Fatalf("doctor on a healthy cluster-mode node without a runtime: exit %d, want 1", code)
	}
	for _, want := range []string{"OK   datastore (etcd) reachable: the last call", "OK   node lease of node-0 provable:", "left before fencing",
		"OK   cluster network pods: 1 blocks owned, ", "OK   no lease in a block this node lost"} {
		if lineWith(lines, want) == "" {
			t.Errorf("no line says %q", want)
		}
	}
	if l := lineWith(lines, "pool pods"); l != "" {
		t.Errorf("cluster mode prints node mode's pool line: %q", l)
	}

	e.Stop()
	deadline := time.Now().Add(60 * time.Second)
	for {
		lines, code = doctorRun(t, n.Socket)
		lease := lineWith(lines, "node lease of node-0")
		ds := lineWith(lines, "datastore (etcd)")
		if strings.HasPrefix(lease, "FAIL") && strings.HasPrefix(ds, "FAIL") {
			if code != 2 || !strings.Contains(lease, "fenced") || !strings.Contains(lease, "fix:") ||
				!strings.Contains(ds, "longer than the node lease's TTL (3s)") || !strings.Contains(ds, "fix:") {
				t.Errorf("doctor with etcd stopped past the lease (exit %d):\n%s\n%s", code, ds, lease)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("doctor never FAILed the lease and the datastore with etcd stopped; last:\n%s", strings.Join(lines, "\n"))
		}
		time.Sleep(500 * time.Millisecond)
	}

	e.Start()
	deadline = time.Now().Add(60 * time.Second)
	for code != 1 { // back to the runtime's WARN only
		if time.Now().After(deadline) {
			t.Fatalf("doctor did not recover with etcd back; last (exit %d):\n%s", code, strings.Join(lines, "\n"))
		}
		time.Sleep(500 * time.Millisecond)
		lines, code = doctorRun(t, n.Socket)
	}
	if _, err := n.Call(api.Request{Op: api.OpDel, Network: network, ContainerID: "c1", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
}
