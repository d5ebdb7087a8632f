package multinode_test

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/testenv/agentenv"
)

// TestEtcdRoutesOff: an agent of etcd mode restarted with --routes=false removes at
// start the routes of ipledger's protocol its earlier run installed (its own block's
// unreachable route among them), and no other route.
func TestEtcdRoutesOff(t *testing.T) {
	c, _ := newEtcdCluster(t, 1)
	h := c.net.Node(0)
	ip := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"-n", h.Netns}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	// what an earlier run with routes on left, and another owner's route
	ip("route", "add", "unreachable", "10.81.0.0/28", "proto", "201")
	ip("route", "add", "10.81.0.16/28", "via", h.Addr4.String(), "proto", "201")
	ip("route", "add", "blackhole", "10.82.0.0/24", "proto", "static")

	a := agentenv.Start(t, agentenv.Options{Netns: h.Netns, Args: []string{"--node-name", h.Name,
		"--datastore", "etcd", "--etcd-endpoints", fmt.Sprintf("http://127.0.0.1:%d", etcdPort),
		"--node-lease-ttl", etcdTTL.String(), "--routes=false"}})
	c.agents[0] = a

	// Start returns once the agent answers, after the removal
	if got := ip("route", "show", "proto", "201"); strings.TrimSpace(got) != "" {
		t.Errorf("routes of protocol 201 left after a start with --routes=false:\n%s", got)
	}
	if got := ip("route", "show", "proto", "static"); !strings.Contains(got, "blackhole 10.82.0.0/24") {
		t.Errorf("another owner's route gone: %q", got)
	}
}
