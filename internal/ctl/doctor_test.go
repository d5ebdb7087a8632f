package ctl_test

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %v: %v: %s", args, err, out)
	}
}

// doctorLines runs the real ipledgerctl doctor and returns its lines and exit status.
func doctorLines(t *testing.T, socket string, args ...string) ([]string, int) {
	t.Helper()
	out, errOut, code := ctlRun(t, socket, append([]string{"doctor"}, args...)...)
	t.Logf("doctor (exit %d):\n%s%s", code, out, errOut)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	for _, l := range lines {
		if !strings.HasPrefix(l, "OK ") && !strings.HasPrefix(l, "WARN ") && !strings.HasPrefix(l, "FAIL ") {
			t.Errorf("doctor line does not start with OK, WARN or FAIL: %q", l)
		}
	}
	return lines, code
}

func hasLine(lines []string, prefix, contains string) bool {
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) && strings.Contains(l, contains) {
			return true
		}
	}
	return false
}

// TestDoctor: doctor finds a loopback set DOWN in a network namespace standing in for
// the host's, an exhausted pool and a pool within 10% of exhaustion, and exits by its
// worst line; and an agent that is not running.
func TestDoctor(t *testing.T) {
	netNS := netenv.Namespace(t, "ipl-doc-")
	ns, nsPath := netNS.Name, netNS.Path
	ipCmd(t, "-n", ns, "link", "set", "lo", "up")
	ipCmd(t, "-n", ns, "link", "set", "lo", "down")

	a := agentenv.Start(t, agentenv.Options{Args: []string{"--reuse-delay", "0s"}})
	tiny, _ := pool.ParseRangeSets([]byte(`[[{"subnet":"10.92.0.0/30"}]]`))  // one usable address
	small, _ := pool.ParseRangeSets([]byte(`[[{"subnet":"10.93.0.0/28"}]]`)) // 13 usable
	if _, err := a.Call(api.Request{Op: api.OpAdd, Network: "tiny", ContainerID: "t0", IfName: "eth0", Ranges: tiny}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Call(api.Request{Op: api.OpAdd, Network: "tiny", ContainerID: "t1", IfName: "eth0", Ranges: tiny}); err == nil {
		t.Fatal("the tiny pool is not exhausted after one ADD")
	}
	for i := range 12 {
		if _, err := a.Call(api.Request{Op: api.OpAdd, Network: "small", ContainerID: fmt.Sprint("s", i), IfName: "eth0", Ranges: small}); err != nil {
			t.Fatal(err)
		}
	}

	lines, code := doctorLines(t, a.Socket, "--netns", nsPath)
	if code != 2 || !hasLine(lines, "FAIL", "host loopback is DOWN in "+nsPath) || !hasLine(lines, "FAIL", "pool tiny exhausted") ||
		!hasLine(lines, "WARN", "pool small within 10% of exhaustion: 92%") || !hasLine(lines, "WARN", "no runtime configured") ||
		!hasLine(lines, "OK", "agent reachable") || !hasLine(lines, "OK", "books balanced") || !hasLine(lines, "OK", "spool empty") {
		t.Fatalf("loopback down, pool exhausted: exit %d, want 2 and those lines", code)
	}

	ipCmd(t, "-n", ns, "link", "set", "lo", "up")
	lines, code = doctorLines(t, a.Socket, "--netns", nsPath)
	if code != 2 || !hasLine(lines, "OK", "host loopback is UP") || !hasLine(lines, "FAIL", "pool tiny exhausted") {
		t.Fatalf("loopback up, pool exhausted: exit %d", code)
	}

	if _, err := a.Call(api.Request{Op: api.OpDel, Network: "tiny", ContainerID: "t0", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	lines, code = doctorLines(t, a.Socket, "--netns", nsPath)
	if code != 1 || hasLine(lines, "FAIL", "") || !hasLine(lines, "OK", "pool tiny: 0% in use") {
		t.Fatalf("only warnings left: exit %d, want 1", code)
	}

	a.Stop()
	lines, code = doctorLines(t, a.Socket, "--netns", nsPath)
	if code != 2 || !hasLine(lines, "FAIL", "agent not reachable") {
		t.Fatalf("agent stopped: exit %d, want 2 and a FAIL line for the agent", code)
	}
}
