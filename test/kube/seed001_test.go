//go:build kubelet

package kube_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
	"github.com/ipledger/ipledger/test/kube/matrix"
)

// seed001 (../shared/seeds/001): a chained plugin after ipledger-veth fails
// ADD for each pod's first two sandboxes and DEL for every sandbox's first
// two attempts, then recovers. Each failed ADD leaves an address leased
// (ipledger-veth's ADD succeeded before the chained plugin failed) in a
// sandbox that is NOTREADY with the address still configured: ipledger keeps
// it (a stranded lease, invariant 4) and the kubelet, which must stop the old
// sandbox before it makes a new one, retries the teardown until the chained
// plugin recovers, and that DEL releases it. Asserted: every pod ends Running
// with one lease, every lease of a failed attempt is released, no address is
// ever held twice. The lifetimes of the failed attempts' leases are reported.
func seed001(t *testing.T, n *node) {
	const ns, pods = "seed001", 6
	n.failPlugin(t)
	ctl := newControl(t, "seed001-control", "10.236.6.0/24")
	fpState := ctl.state
	n.withConflist(t, n.chain("seed001", "10.236.1.0/24", ctl, `"failAdd": 2, "failDel": 2, "failPods": ["leak-"]`))
	n.namespace(t, ns)
	n.c.Apply(t, deployment(ns, "leak", pods))
	// Follow every lease of the network until the pods run and the leaks are
	// gone: when it appeared, when it went, whether a running pod holds it.
	type seen struct {
		first, last time.Time
		l           api.LeaseView
	}
	leases := map[string]*seen{}
	var doubles int
	t0 := time.Now()
	var running []kubeenv.Pod
	err := kubeenv.WaitFor(4*time.Minute, 500*time.Millisecond, func() (bool, error) {
		ls, err := n.leases()
		if err != nil {
			return false, err
		}
		now := time.Now()
		byIP := map[string]int{}
		for _, l := range ls {
			if l.Network != "seed001" {
				continue
			}
			for _, ip := range l.IPs {
				byIP[ip]++
				if byIP[ip] > 1 {
					doubles++
				}
			}
			k := l.ContainerID
			if s, ok := leases[k]; ok {
				s.last = now
			} else {
				leases[k] = &seen{first: now, last: now, l: l}
			}
		}
		running, err = n.readyPods(ns, "app=leak")
		if err != nil {
			return false, err
		}
		live := 0
		for _, l := range ls {
			if l.Network == "seed001" {
				live++
			}
		}
		return len(running) == pods && live == pods, fmt.Errorf("%d of %d pods running, %d leases", len(running), pods, live)
	})
	if err != nil {
		t.Fatalf("%v (leases seen: %d)", err, len(leases))
	}
	n.checkLeasesIn(t, running, "10.236.1.0/24")
	log, _ := os.ReadFile(filepath.Join(fpState, "attempts.log"))
	addFails, delFails := 0, 0
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "failed=true") {
			if strings.Contains(line, " ADD ") {
				addFails++
			} else {
				delFails++
			}
		}
	}
	// The ledger's history: every released holder of the pool's addresses.
	rels := n.history(t, "seed001", "10.236.1.", 80)
	falseRel := n.readyReleased(t, rels)
	leaked, worst := 0, time.Duration(0)
	reasons := map[string]int{}
	for _, r := range rels {
		leaked++
		reasons[string(r.Reason)]++
		if d := r.To.Sub(r.From); d > worst {
			worst = d
		}
	}
	t.Logf("%d pods Running after %v; the chained plugin failed %d ADDs and %d DELs; %d leases of failed sandboxes released (reasons %v), the longest held %v; %d leases seen while sampling; %d double assignments seen",
		pods, time.Since(t0).Round(time.Millisecond), addFails, delFails, leaked, reasons, worst.Round(time.Millisecond), len(leases), doubles)
	if leaked == 0 || addFails == 0 || delFails == 0 {
		t.Errorf("the scenario did not happen: %d leases of failed sandboxes seen, %d ADDs and %d DELs failed", leaked, addFails, delFails)
	}
	if doubles > 0 {
		t.Errorf("%d times an address was leased twice", doubles)
	}
	n.c.MustKubectl(t, "scale", "-n", ns, "deployment/leak", "--replicas=0")
	n.waitGone(t, ns, "app=leak", 2*time.Minute)
	_, left := n.drain(t, time.Minute)
	hl := ctl.held(t)
	t.Logf("after the pods are gone: host-local holds %d addresses, ipledger %d", hl, left)
	n.record(t, matrix.Cell{Scenario: "seed 001", Sandboxes: ctl.sandboxes(t), HostLocalLeaked: hl, IpledgerLeaked: left,
		FalseReleases: falseRel, Reclaim: worst.Round(time.Second).String(), Note: fmt.Sprintf("%d ADDs and %d DELs failed", addFails, delFails)})
}
