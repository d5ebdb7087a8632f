//go:build kubelet

package kube_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
	"github.com/ipledger/ipledger/test/kube/matrix"
)

// teardownSkip is containerd#10744's case (issue 33): containerd is SIGKILLed
// while a sandbox's CNI ADD is in flight, after ipledger's part of the chain
// answered and before containerd saved the result. A chained plugin after
// ipledger blocks each pod's first ADD until the kill, so the window is
// certain. containerd is restarted; the kubelet stops the lost sandbox and
// makes a new one. containerd 1.7.23-1.7.30 and 2.0.0-2.2.1 skip the CNI DEL
// of a sandbox whose result was never saved (fixed by containerd#12923 in
// 1.7.31, 2.0.8, 2.1.7, 2.2.2); the test records whether the DEL came, on
// whatever runtime runs it, and asserts:
//   - ipledger had leased each lost sandbox's address before the kill (the
//     window happened);
//   - the reconciler releases every one of them, DEL or not, and no lease of
//     a READY sandbox (0 false releases): the time from the kill to the last
//     release is the time to reclaim;
//   - after the pods are gone, ipledger holds nothing (0 leaked);
//   - host-local, called beside ipledger for the same sandboxes, holds
//     exactly the addresses of the lost sandboxes the runtime sent no DEL
//     for: the control leaks where the runtime skips the DEL.
func teardownSkip(t *testing.T, n *node) {
	const ns, pods, net, subnet = "issue10744", 3, "issue10744", "10.236.4.0/24"
	n.failPlugin(t)
	ctl := newControl(t, "issue10744-control", "10.236.5.0/24")
	fp := ctl.state
	n.withConflist(t, n.chain(net, subnet, ctl, `"blockAddPods": ["skip-"]`))
	n.namespace(t, ns)
	n.c.Apply(t, deployment(ns, "skip", pods))

	// every pod's first ADD is blocked after ipledger answered
	var blocked []string
	if err := kubeenv.WaitFor(2*time.Minute, 300*time.Millisecond, func() (bool, error) {
		ms, err := filepath.Glob(filepath.Join(fp, "blocked-*"))
		blocked = blocked[:0]
		for _, m := range ms {
			blocked = append(blocked, strings.TrimPrefix(filepath.Base(m), "blocked-"))
		}
		return len(blocked) == pods, fmt.Errorf("%d of %d ADDs blocked (%v)", len(blocked), pods, err)
	}); err != nil {
		t.Fatal(err)
	}
	ls, err := n.leases()
	if err != nil {
		t.Fatal(err)
	}
	lost := map[string]api.LeaseView{}
	for _, l := range ls {
		if l.Network == net && slices.Contains(blocked, l.ContainerID) {
			lost[l.ContainerID] = l
		}
	}
	if len(lost) != pods {
		t.Fatalf("ipledger leased %d of the %d blocked sandboxes before the kill:%s", len(lost), pods, describeLeases(ls))
	}
	held := ctl.held(t)
	if held != pods {
		t.Fatalf("the host-local control holds %d addresses with %d ADDs blocked", held, pods)
	}

	tKill := time.Now()
	pid := n.c.Containerd.PID()
	n.c.Containerd.Kill()
	n.c.Containerd.Restart(t)
	t.Logf("containerd (pid %d) SIGKILLed with %d ADDs in flight (ipledger's part answered), restarted (pid %d) in %v",
		pid, pods, n.c.Containerd.PID(), time.Since(tKill).Round(time.Millisecond))

	// the pods run on new sandboxes, and the lost sandboxes' leases go
	var running []kubeenv.Pod
	if err := kubeenv.WaitFor(4*time.Minute, 500*time.Millisecond, func() (bool, error) {
		var err error
		running, err = n.readyPods(ns, "app=skip")
		if err != nil {
			return false, err
		}
		ls, err := n.leases()
		if err != nil {
			return false, err
		}
		left := 0
		for _, l := range ls {
			if _, ok := lost[l.ContainerID]; ok {
				left++
			}
		}
		return len(running) == pods && left == 0, fmt.Errorf("%d of %d pods running, %d leases of lost sandboxes left", len(running), pods, left)
	}); err != nil {
		ls, _ := n.leases()
		t.Fatalf("%v:%s", err, describeLeases(ls))
	}
	n.checkLeasesIn(t, running, subnet)
	rels := n.history(t, net, "10.236.4.", 20)
	falseRel := n.readyReleased(t, rels)
	var reclaim time.Duration
	reasons := map[string]int{}
	for _, r := range rels {
		if _, ok := lost[r.Key.ContainerID]; ok {
			reasons[string(r.Reason)]++
			if d := r.To.Sub(tKill); d > reclaim {
				reclaim = d
			}
		}
	}
	dels := 0
	for _, id := range attempts(t, fp)["DEL"] {
		if _, ok := lost[id]; ok {
			dels++
		}
	}
	t.Logf("%s: the runtime sent %d DELs for the %d lost sandboxes; ipledger released their leases (reasons %v) %v after the kill at the latest",
		n.runtimeVersion(t), dels, pods, reasons, reclaim.Round(time.Millisecond))

	n.c.MustKubectl(t, "scale", "-n", ns, "deployment/skip", "--replicas=0")
	n.waitGone(t, ns, "app=skip", 2*time.Minute)
	_, left := n.drain(t, time.Minute)
	// DELs of the lost sandboxes, counted again: the kubelet may remove them
	// (RemovePodSandbox) after the new ones run.
	delled := map[string]bool{}
	for _, id := range attempts(t, fp)["DEL"] {
		if _, ok := lost[id]; ok {
			delled[id] = true
		}
	}
	hlLeaked := ctl.held(t)
	t.Logf("after the pods are gone: host-local holds %d addresses, ipledger %d; the runtime never sent a DEL for %d of the %d lost sandboxes",
		hlLeaked, left, pods-len(delled), pods)
	if hlLeaked != pods-len(delled) {
		t.Errorf("the control holds %d addresses, but the runtime sent no DEL for %d lost sandboxes: the control did not see what ipledger saw", hlLeaked, pods-len(delled))
	}
	note := fmt.Sprintf("DEL for %d of %d lost sandboxes", len(delled), pods)
	n.record(t, matrix.Cell{Scenario: "containerd#10744", Sandboxes: ctl.sandboxes(t), HostLocalLeaked: hlLeaked, IpledgerLeaked: left,
		FalseReleases: falseRel, Reclaim: reclaim.Round(time.Second).String(), Note: note})
}
