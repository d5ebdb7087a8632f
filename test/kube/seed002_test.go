//go:build kubelet

package kube_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/cri"
)

// seed002 (../shared/seeds/002): four pods whose sandboxes the kubelet keeps
// re-creating (their pause process killed again and again), the old
// sandboxes' DEL failing (first two attempts) for two of them, on an
// 8-address pool: the pool never runs out and no pod holds two leases for
// longer than the release grace plus one reconcile interval.
func seed002(t *testing.T, n *node) {
	const ns, duration, every = "seed002", 60 * time.Second, 2500 * time.Millisecond
	n.failPlugin(t)
	fpState := t.TempDir()
	n.withConflist(t, fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "seed002",
  "plugins": [
    {"type": "ipledger-veth", "mtu": 1500,
     "ipam": {"type": "ipledger", "socket": %q, "spoolDir": %q,
              "ranges": [[{"subnet": "10.236.2.0/24", "rangeStart": "10.236.2.10", "rangeEnd": "10.236.2.17"}]]}},
    {"type": "ipledger-testfail", "failDel": 2, "failPods": ["crash-a", "crash-b"], "stateDir": %q}
  ]
}`, n.sock, filepath.Join(n.stateDir, "spool"), fpState))
	n.namespace(t, ns)
	for _, p := range []string{"crash-a", "crash-b", "crash-c", "crash-d"} {
		n.c.Apply(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s, labels: {app: crash}}
spec:
  terminationGracePeriodSeconds: 1
  automountServiceAccountToken: false
  enableServiceLinks: false
  containers:
  - {name: main, image: %s, imagePullPolicy: Never, command: ["/bin/busybox", "sleep", "100000"]}
`, p, ns, podImage))
	}
	n.waitRunning(t, ns, "app=crash", 4, 2*time.Minute)
	crc := n.c.Containerd.Client(t)
	ctx := context.Background()
	limit := 10*time.Second + 3*time.Second // --release-grace + --reconcile-interval as applied
	doubleSince := map[string]time.Time{}
	var worstDouble time.Duration
	kills, maxLeases := 0, 0
	deadline := time.Now().Add(duration)
	nextKill := time.Now()
	victim := 0
	for time.Now().Before(deadline) {
		if time.Now().After(nextKill) {
			if pid := readyPause(t, crc, n, ns, fmt.Sprintf("crash-%c", 'a'+victim%4)); pid > 0 {
				if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
					kills++
				}
			}
			victim++
			nextKill = time.Now().Add(every)
		}
		ls, err := n.leases()
		if err != nil {
			t.Fatal(err)
		}
		perUID := map[string]int{}
		pool := 0
		for _, l := range ls {
			if l.Network == "seed002" {
				perUID[l.UID]++
				pool++
			}
		}
		if pool > maxLeases {
			maxLeases = pool
		}
		now := time.Now()
		for uid, c := range perUID {
			if c > 1 {
				if _, ok := doubleSince[uid]; !ok {
					doubleSince[uid] = now
				}
				if d := now.Sub(doubleSince[uid]); d > worstDouble {
					worstDouble = d
				}
			} else {
				delete(doubleSince, uid)
			}
		}
		for uid := range doubleSince {
			if perUID[uid] <= 1 {
				delete(doubleSince, uid)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	pods := n.waitRunning(t, ns, "app=crash", 4, 3*time.Minute)
	n.checkLeasesIn(t, pods, "10.236.2.0/24")
	restarts := 0
	for _, p := range pods {
		for _, c := range p.Status.ContainerStatuses {
			restarts += c.RestartCount
		}
	}
	ev, _ := n.c.Kubectl("get", "events", "-n", ns, "-o", "jsonpath={range .items[*]}{.reason}:{.message}{\"\\n\"}{end}")
	exhausted := strings.Count(strings.ToLower(ev), "exhaust")
	log, _ := os.ReadFile(filepath.Join(fpState, "attempts.log"))
	delFails := strings.Count(string(log), "failed=true")
	sbs, _ := crc.ListSandboxes(ctx)
	attempts := 0
	for _, s := range sbs {
		if s.Namespace == ns && int(s.Attempt) > attempts {
			attempts = int(s.Attempt)
		}
	}
	t.Logf("%v: %d pause processes killed, highest sandbox attempt %d, %d container restarts, %d old-sandbox DELs failed; at most %d of 8 addresses leased; longest time a pod held two leases %v (bound %v); %d pool-exhausted events",
		duration, kills, attempts, restarts, delFails, maxLeases, worstDouble.Round(time.Millisecond), limit, exhausted)
	if exhausted > 0 {
		t.Errorf("the pool ran out %d times:\n%s", exhausted, ev)
	}
	if worstDouble > limit+2*time.Second {
		t.Errorf("a pod held two leases for %v, more than the grace plus one interval (%v)", worstDouble, limit)
	}
	if kills < 10 || delFails == 0 {
		t.Errorf("the scenario did not happen: %d kills, %d failed DELs", kills, delFails)
	}
	n.c.MustKubectl(t, "delete", "pods", "-n", ns, "--all", "--wait=true")
	n.settle(t, time.Minute)
}

// readyPause returns the PID of the pause process of the pod's READY
// sandbox (checked to be /pause), 0 when it has none right now.
func readyPause(t *testing.T, c *cri.Client, n *node, ns, pod string) int {
	t.Helper()
	sbs, err := c.ListSandboxes(context.Background())
	if err != nil {
		return 0
	}
	for _, s := range sbs {
		if s.Namespace != ns || s.Name != pod || !s.Ready() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(n.c.Containerd.StateDir(), "io.containerd.runtime.v2.task", "k8s.io", s.ID, "init.pid"))
		if err != nil {
			return 0
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if pid > 1 && strings.HasPrefix(string(cmd), "/pause") {
			return pid
		}
	}
	return 0
}
