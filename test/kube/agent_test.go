//go:build kubelet

package kube_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

func spooled(n *node) int {
	ents, _ := os.ReadDir(filepath.Join(n.stateDir, "spool"))
	c := 0
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".del") {
			c++
		}
	}
	return c
}

func (n *node) waitAgent(t testing.TB, timeout time.Duration) {
	t.Helper()
	if err := kubeenv.WaitFor(timeout, 300*time.Millisecond, func() (bool, error) {
		pods, err := n.c.Pods("ipledger", "app=ipledgerd")
		if err != nil {
			return false, err
		}
		_, lerr := n.leases()
		return len(pods) == 1 && pods[0].Ready() && lerr == nil, fmt.Errorf("%d agent pods, leases: %v", len(pods), lerr)
	}); err != nil {
		t.Fatalf("agent not back: %v", err)
	}
}

func (n *node) waitNoAgent(t testing.TB, timeout time.Duration) {
	t.Helper()
	if err := kubeenv.WaitFor(timeout, 300*time.Millisecond, func() (bool, error) {
		pods, err := n.c.Pods("ipledger", "app=ipledgerd")
		return err == nil && len(pods) == 0, fmt.Errorf("%d agent pods (%v)", len(pods), err)
	}); err != nil {
		t.Fatalf("agent pod not gone: %v", err)
	}
}

// agentDeleted: the DaemonSet removed while pods run and are deleted (leases
// stay on disk, DELs are spooled and applied when the DaemonSet is back);
// removed again during a scale-up (ADDs refused, retried by the kubelet,
// succeeding once it is back); then the agent's pod deleted during a scale-up
// and a scale-down (the DaemonSet re-creates it).
func agentDeleted(t *testing.T, n *node) {
	const ns = "agent"
	n.namespace(t, ns)
	n.c.Apply(t, deployment(ns, "ag", 20))
	n.waitRunning(t, ns, "app=ag", 20, 3*time.Minute)

	n.c.MustKubectl(t, "delete", "daemonset", "-n", "ipledger", "ipledgerd", "--wait=true")
	n.waitNoAgent(t, time.Minute)
	if fi, err := os.Stat(filepath.Join(n.stateDir, "ledger.db")); err != nil || fi.Size() == 0 {
		t.Fatalf("ledger.db after removing the DaemonSet: %v", err)
	}
	n.c.MustKubectl(t, "scale", "-n", ns, "deployment/ag", "--replicas=8")
	n.waitRunning(t, ns, "app=ag", 8, 3*time.Minute)
	sp := spooled(n)
	if sp < 12 {
		t.Fatalf("%d DELs spooled for 12 pods deleted while the agent was away", sp)
	}
	n.c.Apply(t, n.manifest)
	n.waitAgent(t, 2*time.Minute)
	survivors := n.waitRunning(t, ns, "app=ag", 8, time.Minute)
	n.checkLeases(t, survivors)
	if left := spooled(n); left != 0 {
		t.Errorf("%d spooled DELs left after the agent came back", left)
	}
	t.Logf("DaemonSet removed with 20 pods: ledger kept on disk; 12 pods deleted meanwhile, %d DELs spooled, applied at the agent's return; the 8 survivors' leases intact", sp)

	// ADDs while no agent runs: refused (try again later), retried by the
	// kubelet, and they succeed once the agent is back.
	n.c.MustKubectl(t, "delete", "daemonset", "-n", "ipledger", "ipledgerd", "--wait=true")
	n.waitNoAgent(t, time.Minute)
	n.c.MustKubectl(t, "scale", "-n", ns, "deployment/ag", "--replicas=20")
	failedCreates := func() int {
		ev, _ := n.c.Kubectl("get", "events", "-n", ns, "--field-selector", "reason=FailedCreatePodSandBox", "-o", "name")
		return len(strings.Fields(ev))
	}
	if err := kubeenv.WaitFor(time.Minute, 500*time.Millisecond, func() (bool, error) {
		return failedCreates() > 0, fmt.Errorf("no failed sandbox creation while the agent is away")
	}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	n.c.Apply(t, n.manifest)
	running := n.waitRunning(t, ns, "app=ag", 20, 4*time.Minute)
	n.waitAgent(t, 2*time.Minute)
	n.checkLeases(t, running)
	t.Logf("scale-up 8 -> 20 with no agent: %d sandbox creations failed (events); all 20 Running %v after the DaemonSet was re-applied, each leased to its pod",
		failedCreates(), time.Since(t0).Round(time.Millisecond))

	// The agent's pod deleted during a scale-up (the DaemonSet re-creates it).
	t0 = time.Now()
	before := failedCreates()
	n.c.MustKubectl(t, "delete", "pod", "-n", "ipledger", "-l", "app=ipledgerd", "--wait=false")
	n.c.MustKubectl(t, "scale", "-n", ns, "deployment/ag", "--replicas=30")
	running = n.waitRunning(t, ns, "app=ag", 30, 4*time.Minute)
	// The new agent may be starting still (it refuses the socket while the old
	// one drains, and the kubelet restarts it).
	n.waitAgent(t, 2*time.Minute)
	n.checkLeases(t, running)
	t.Logf("agent pod deleted, then scale-up 20 -> 30: all 30 Running in %v, %d more sandbox creations failed and were retried by the kubelet", time.Since(t0).Round(time.Millisecond), failedCreates()-before)

	// And during the scale-down.
	n.c.MustKubectl(t, "scale", "-n", ns, "deployment/ag", "--replicas=0")
	n.c.MustKubectl(t, "delete", "pod", "-n", "ipledger", "-l", "app=ipledgerd", "--wait=false")
	n.waitGone(t, ns, "app=ag", 3*time.Minute)
	n.waitAgent(t, 2*time.Minute)
	d := n.settle(t, time.Minute)
	if left := spooled(n); left != 0 {
		t.Errorf("%d spooled DELs left", left)
	}
	t.Logf("agent pod deleted during scale-down 30 -> 0: ledger empty %v after the pods were gone, spool empty, audit balanced", d.Round(time.Millisecond))
}
