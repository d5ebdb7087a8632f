//go:build kubelet

package kube_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/test/kube/matrix"
)

// seed004 (../shared/seeds/004): containerd killed (SIGKILL) and restarted
// three times while a Deployment churns. After each restart, once the kubelet
// has settled, no false release: every Running pod's address is leased to it
// and configured in its namespace. At the end, nothing leaked. In a matrix
// run, the host-local control is chained in beside ipledger.
func seed004(t *testing.T, n *node) {
	const ns, pods = "seed004", 30
	ctl, withCtl := n.withControl(t, "10.236.8.0/24")
	n.namespace(t, ns)
	n.c.Apply(t, deployment(ns, "r004", 0))
	restart := func(phase string) {
		t0 := time.Now()
		pid := n.c.Containerd.PID()
		n.c.Containerd.Kill()
		time.Sleep(2 * time.Second)
		n.c.Containerd.Restart(t)
		t.Logf("%s: containerd (pid %d) killed and restarted (pid %d) in %v", phase, pid, n.c.Containerd.PID(), time.Since(t0).Round(time.Millisecond))
	}
	// checkRunning: every Ready pod's address is in the ledger as that pod's
	// and on eth0 in the network namespace of the pod's READY sandbox (read
	// from the host through the runtime's status: the kubelet's exec path may
	// still be reconnecting to the restarted runtime).
	crc := n.c.Containerd.Client(t)
	falseRel := 0
	checkRunning := func(phase string, want int) {
		running := n.waitRunning(t, ns, "app=r004", want, 4*time.Minute)
		n.checkLeases(t, running)
		if withCtl {
			falseRel += n.readyReleased(t, n.history(t, network, poolPrefix, 254))
		}
		sbs, err := crc.ListSandboxes(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range running {
			found := false
			for _, s := range sbs {
				if s.Namespace != ns || s.Name != p.Metadata.Name || !s.Ready() {
					continue
				}
				found = true
				st, err := crc.SandboxStatus(context.Background(), s.ID)
				if err != nil || st.NetNSPath == "" {
					t.Errorf("%s: pod %s: sandbox status: %v (netns %q)", phase, p.Metadata.Name, err, st.NetNSPath)
					continue
				}
				out, err := exec.Command("nsenter", "--net="+st.NetNSPath, "ip", "-4", "addr", "show", "dev", "eth0").CombinedOutput()
				if err != nil || !strings.Contains(string(out), " "+p.Status.PodIP+"/") {
					t.Errorf("%s: pod %s: address %s not on eth0 in %s: %v\n%s", phase, p.Metadata.Name, p.Status.PodIP, st.NetNSPath, err, out)
				}
			}
			if !found {
				t.Errorf("%s: pod %s is Running but the runtime lists no READY sandbox for it", phase, p.Metadata.Name)
			}
		}
		t.Logf("%s: %d pods Running, each address leased to its pod and on eth0 in its sandbox's namespace", phase, len(running))
	}

	// 1: during the scale-up.
	n.c.MustKubectl(t, "scale", "-n", ns, "deployment/r004", fmt.Sprintf("--replicas=%d", pods))
	time.Sleep(3 * time.Second)
	restart("during scale-up")
	checkRunning("after restart during scale-up", pods)
	// 2: at rest.
	restart("at rest")
	checkRunning("after restart at rest", pods)
	// 3: during the scale-down, then back up.
	n.c.MustKubectl(t, "scale", "-n", ns, "deployment/r004", "--replicas=10")
	time.Sleep(2 * time.Second)
	restart("during scale-down")
	checkRunning("after restart during scale-down", 10)
	n.c.MustKubectl(t, "scale", "-n", ns, "deployment/r004", "--replicas=0")
	n.waitGone(t, ns, "app=r004", 3*time.Minute)
	d, left := n.drain(t, 2*time.Minute)
	t.Logf("after 3 containerd restarts: all pods gone, ledger empty %v later, audit balanced", d.Round(time.Millisecond))
	if withCtl {
		n.record(t, matrix.Cell{Scenario: "seed 004", Sandboxes: ctl.sandboxes(t), HostLocalLeaked: ctl.held(t), IpledgerLeaked: left,
			FalseReleases: falseRel, Reclaim: d.Round(time.Second).String(), Note: fmt.Sprintf("%d pods, containerd SIGKILLed 3 times", pods)})
	}
}
