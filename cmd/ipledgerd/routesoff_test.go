package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// TestRoutesOffRemovedAtStart: an agent that makes no routes (here: no --node-name
// nor --datastore etcd) removes, at start, the routes of ipledger's protocol an
// earlier run left in its namespace, and leaves another owner's route alone.
func TestRoutesOffRemovedAtStart(t *testing.T) {
	name := netenv.Namespace(t, "ipl-routesoff-").Name
	ip := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"-n", name}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	ip("link", "set", "lo", "up")
	ip("route", "add", "blackhole", "10.244.1.0/24", "proto", "201")
	ip("-6", "route", "add", "unreachable", "fd00:244:0:1::/64", "proto", "201")
	ip("route", "add", "blackhole", "10.244.3.0/24", "proto", "static")

	agentenv.Start(t, agentenv.Options{Netns: name})

	// Start returns once the agent answers, after the removal
	if got := ip("route", "show", "proto", "201") + ip("-6", "route", "show", "proto", "201"); strings.TrimSpace(got) != "" {
		t.Errorf("routes of protocol 201 left after the start:\n%s", got)
	}
	if got := ip("route", "show", "proto", "static"); !strings.Contains(got, "blackhole 10.244.3.0/24") {
		t.Errorf("another owner's route gone: %q", got)
	}
}
