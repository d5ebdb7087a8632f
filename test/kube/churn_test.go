//go:build kubelet

package kube_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ipledger/ipledger/test/kube/matrix"
)

// churn: a Deployment scaled 0 -> 60 -> 0, three times in a matrix run (the
// host-local control chained in beside ipledger: the figures docs/runtimes.md
// compares), twice in make test (a second cycle is what proves the addresses
// released by the first come back clean; a third costs two minutes of the
// kubelet lane and proves nothing more). Every pod Running with a distinct
// address leased to it; the node reaches every pod and a pod reaches another;
// after each scale-down zero leases and the audit balanced.
func churn(t *testing.T, n *node) {
	const ns, pods = "churn", 60
	ctl, withCtl := n.withControl(t, "10.236.7.0/24")
	cycles := 2
	if withCtl {
		cycles = 3
	}
	n.namespace(t, ns)
	n.c.Apply(t, deployment(ns, "churn", 0))
	seen := map[string]bool{}
	falseRel, left := 0, 0
	var reclaim time.Duration
	for cycle := 1; cycle <= cycles; cycle++ {
		t0 := time.Now()
		n.c.MustKubectl(t, "scale", "-n", ns, "deployment/churn", "--replicas=60")
		running := n.waitRunning(t, ns, "app=churn", pods, 4*time.Minute)
		up := time.Since(t0)
		n.checkLeases(t, running)
		if withCtl {
			falseRel += n.readyReleased(t, n.history(t, network, poolPrefix, 254))
		}
		ips := podIPs(running)
		for _, ip := range ips {
			seen[ip] = true
		}
		pingFromNode(t, ips)
		n.pingFromPod(t, running[0], running[len(running)-1].Status.PodIP)
		n.pingFromPod(t, running[len(running)-1], running[0].Status.PodIP)
		t1 := time.Now()
		n.c.MustKubectl(t, "scale", "-n", ns, "deployment/churn", "--replicas=0")
		n.waitGone(t, ns, "app=churn", 3*time.Minute)
		down := time.Since(t1)
		settle, l := n.drain(t, time.Minute)
		left += l
		reclaim = max(reclaim, settle)
		t.Logf("cycle %d: %d pods Running in %v, ping node->%d pods and pod<->pod ok, all gone in %v, ledger empty %v later, audit balanced",
			cycle, pods, up.Round(time.Millisecond), len(ips), down.Round(time.Millisecond), settle.Round(time.Millisecond))
		if t.Failed() {
			return
		}
	}
	t.Logf("%d cycles of %d pods: %d distinct addresses used", cycles, pods, len(seen))
	if withCtl {
		n.record(t, matrix.Cell{Scenario: "churn", Sandboxes: ctl.sandboxes(t), HostLocalLeaked: ctl.held(t), IpledgerLeaked: left,
			FalseReleases: falseRel, Reclaim: reclaim.Round(time.Second).String(), Note: fmt.Sprintf("0 -> %d -> 0, %d times", pods, cycles)})
	}
}
