package kube_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	kubeenv "github.com/ipledger/ipledger/internal/testenv/kube"
)

// seed001 (../shared/seeds/001): a chained plugin after ipledger-veth fails
// ADD for each pod's first three sandboxes and DEL for each sandbox's first
// attempt. containerd 1.6 tears a failed sandbox down with a DEL that fails
// (the chained plugin runs first) and swallows the error, so ipledger-veth's
// DEL never runs: one address per failed attempt is left leased. The
// reconciler must release every such lease within the release grace plus one
// interval of the sandbox being gone, and no address may be held twice.
func seed001(t *testing.T, n *node) {
	const ns, pods = "seed001", 6
	n.failPlugin(t)
	fpState := t.TempDir()
	n.withConflist(t, fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "seed001",
  "plugins": [
    {"type": "ipledger-veth", "mtu": 1500,
     "ipam": {"type": "ipledger", "socket": %q, "spoolDir": %q,
              "ranges": [[{"subnet": "10.236.1.0/24"}]]}},
    {"type": "ipledger-testfail", "failAdd": 3, "failDel": 1, "failPods": ["leak-"], "stateDir": %q}
  ]
}`, n.sock, filepath.Join(n.stateDir, "spool"), fpState))
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
		all, err := n.c.Pods(ns, "app=leak")
		if err != nil {
			return false, err
		}
		running = running[:0]
		for _, p := range all {
			if ready(p) {
				running = append(running, p)
			}
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
	n.checkLeases(t, running)
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
	leaked, worst := 0, time.Duration(0)
	for _, s := range leases {
		held := false
		for _, p := range running {
			if p.Metadata.UID == s.l.UID && strings.HasPrefix(s.l.IPs[0], p.Status.PodIP+"/") {
				held = true
			}
		}
		if held {
			continue
		}
		leaked++
		if d := s.last.Sub(s.first); d > worst {
			worst = d
		}
	}
	bound := 10*time.Second + 3*time.Second
	t.Logf("%d pods Running after %v; the chained plugin failed %d ADDs and %d DELs; %d leases left by failed sandboxes, each released at most %v after it was first seen (grace+interval %v); %d double assignments seen",
		pods, time.Since(t0).Round(time.Millisecond), addFails, delFails, leaked, worst.Round(time.Millisecond), bound, doubles)
	if leaked == 0 {
		t.Error("no lease was left by a failed sandbox: the scenario did not happen")
	}
	if doubles > 0 {
		t.Errorf("%d times an address was leased twice", doubles)
	}
	// A leak is observed from its ADD; it may only be judged once the sandbox
	// is gone, which the runtime reports right after the failed ADD.
	if worst > bound+5*time.Second {
		t.Errorf("a leaked lease lived %v, more than grace plus one interval (%v) and a sampling margin", worst, bound)
	}
	n.c.MustKubectl(t, "scale", "-n", ns, "deployment/leak", "--replicas=0")
	n.waitGone(t, ns, "app=leak", 2*time.Minute)
	n.settle(t, time.Minute)
}
