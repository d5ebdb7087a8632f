//go:build kubelet

// Package kubewitness_test runs the API-witness incidents (issue 27) on three
// kubelet nodes (internal/testenv/nodesenv): a package of its own, so that it
// fits go test's default timeout beside another kubelet package.
package kubewitness_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
	"github.com/ipledger/ipledger/internal/testenv/nodesenv"
)

// cluster is the three-node environment with the witness's plugin setup.
type cluster struct{ *nodesenv.Cluster }

// The witness test's agents reconcile every 5 s with a 10 s grace, so a release
// the API allows comes within grace + two intervals (20 s) of the evidence;
// without the API the stranded leases are watched for witnessHold, past that.
const (
	witnessInterval = 5 * time.Second
	witnessGrace    = 10 * time.Second
	witnessHold     = 2 * (witnessGrace + witnessInterval)
	// failDir is, on every node, the test plugin's state and its switch: while
	// failDir/fail-del exists, the DEL of a pod named leak-* fails.
	failDir = "/var/lib/cni/testfail"
)

// TestAPIWitness (issue 27) runs the two incidents where the runtime alone
// cannot let an address go, on three kubelet nodes with deploy/ipledger.yaml
// (node mode), first with --api-evidence=false, then with the API as the
// reconciler's second witness (the default):
//
//   - seed 000's form: a Job's pod completes on node1 (Succeeded in the API),
//     then a second sandbox is made for it, as the seed's kubelet did (here
//     through the CRI, with the pod's metadata and the kubelet's labels), and
//     its teardown fails (a chained plugin fails DEL, as the seed's DEL failed
//     for want of a netns): the sandbox is NOTREADY with the address still
//     configured, a stranded lease;
//   - seed 004's form: containerd is stopped on node2, a running pod is
//     deleted from the API meanwhile, and its sandbox's teardown fails when
//     containerd is back.
//
// Without the API both leases are kept (reported stranded, with a Warning
// Event on the pod) for as long as they are watched; with it each is released
// within grace + one interval of the evidence, its interface removed first. A
// Job pod whose teardown works is released by its DEL either way. The times
// are logged. Beside them, the never-alone cases on real parts: a pod deleted
// and re-created under its name on node0 keeps its new address; a running
// pod removed from etcd behind the apiserver (the API restored from a backup
// that predates it) is released by the DEL of the kubelet's teardown, not by
// the reconciler; and the apiserver stopped for longer than grace + two
// intervals (every agent's watch cache stale) takes no running pod's
// address. One sentinel pod runs on every node throughout and keeps its
// lease. (A watch cache missing a pod is tested in internal/reconcile, with
// the other cases against a fake API.) The pods' Events are printed as
// `kubectl get events` shows them.
func TestAPIWitness(t *testing.T) {
	cl := &cluster{nodesenv.StartNodes(t, 3)}
	cl.failPlugin()
	t0 := time.Now()
	cl.C.Apply(t, witnessManifest(t, false))
	cl.WaitAgents("deploy/ipledger.yaml with a failing test plugin chained, --api-evidence=false", t0)
	w := &witness{cl: cl, t: t, seen: map[string]seenLease{}}
	w.sample()
	for _, nd := range cl.Nodes {
		w.sleeper("live-"+nd.Name, nd.Name)
	}
	live := map[string]seenLease{}
	for _, nd := range cl.Nodes {
		live["live-"+nd.Name] = w.waitLease("live-" + nd.Name)
	}
	t.Cleanup(func() {
		for _, nd := range cl.Nodes {
			os.Remove(nd.HostPath(filepath.Join(failDir, "fail-del")))
		}
	})

	// Without the API.
	before := w.incidents("a")
	t.Logf("without the API: the Job pod whose teardown works released %v after its container exited", before.done.Round(time.Second))
	for _, name := range []string{before.secondSandbox, before.deleted} {
		w.stranded(name)
	}
	time.Sleep(witnessHold)
	for _, name := range []string{before.secondSandbox, before.deleted} {
		if r := w.released(name); r != nil {
			t.Errorf("without the API, %s's stranded lease was released (%s: %s)", name, r.Reason, r.Detail)
		}
		w.stranded(name)
	}
	t.Logf("without the API: both stranded leases kept for %v after the evidence (seed 000's second sandbox of a Succeeded pod, seed 004's pod deleted)", witnessHold)

	// With the API: the agents restarted with the default.
	t1 := time.Now()
	cl.C.Apply(t, witnessManifest(t, true))
	cl.C.MustKubectl(t, "rollout", "status", "daemonset/ipledgerd", "-n", "ipledger", "--timeout=3m")
	cl.WaitAgents("--api-evidence=true (the default)", t1)
	rolled := time.Now()
	for _, name := range []string{before.secondSandbox, before.deleted} {
		r := w.waitReleased(name, 2*time.Minute)
		t.Logf("with the API: %s's lease, stranded since phase one, released %v after the agents rolled out (%s: %s)", name, r.To.Sub(rolled).Round(time.Second), r.Reason, r.Detail)
	}
	after := w.incidents("b")
	for _, x := range []struct {
		name, what string
		from       time.Time
	}{
		{after.secondSandbox, "seed 000's form: the Succeeded pod's second sandbox stopped (its teardown failed)", after.stopped},
		{after.deleted, "seed 004's form: containerd back after the pod's deletion", after.ctrdBack},
	} {
		r := w.waitReleased(x.name, 2*time.Minute)
		took := r.To.Sub(x.from)
		t.Logf("with the API: %s released %v after %s (%s: %s)", x.name, took.Round(time.Second), x.what, r.Reason, r.Detail)
		if !strings.Contains(r.Detail, "removed interface") {
			t.Errorf("%s released without its interface removed first: %s", x.name, r.Detail)
		}
	}
	t.Logf("with the API: the Job pod whose teardown works released %v after its container exited", after.done.Round(time.Second))

	// Never alone: a pod re-created under its name keeps its new address.
	w.sleeper("same", "node0")
	first := w.waitLease("same")
	cl.C.MustKubectl(t, "delete", "pod", "same", "--wait=true")
	w.forget("same")
	w.sleeper("same", "node0")
	second := w.waitLeaseOf("same", func(s seenLease) bool { return s.UID != first.UID })
	if second.UID == first.UID {
		t.Fatalf("pod same re-created with the same UID %s", first.UID)
	}
	// Never alone: the API restored from a backup taken before a running pod
	// existed (its object removed from etcd behind the apiserver). The kubelet
	// then stops the pod, whose DEL releases the address; the reconciler,
	// seeing the pod gone from the API while its sandbox is READY, does not.
	w.sleeper("restored", "node0")
	restored := w.waitLease("restored")
	ec, err := clientv3.New(clientv3.Config{Endpoints: []string{cl.C.EtcdURL}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	if dr, err := ec.Delete(t.Context(), "/registry/pods/default/restored"); err != nil || dr.Deleted != 1 {
		t.Fatalf("removing pod restored from etcd: %+v %v", dr, err)
	}
	ec.Close()
	if r := w.waitReleased("restored", 2*time.Minute); r.Reason != "DEL" {
		t.Errorf("pod restored, gone from the API while running: released by %s (%s), want the DEL of the kubelet's teardown", r.Reason, r.Detail)
	} else {
		t.Logf("never alone: pod restored removed from etcd while running: released by its DEL %v later, after the kubelet stopped it (sandbox %.12s)", r.To.Sub(removed).Round(time.Second), restored.ContainerID)
	}
	// Never alone: the API down for longer than grace + two intervals.
	cl.C.StopAPIServer()
	down := time.Now()
	time.Sleep(witnessGrace + 2*witnessInterval + 2*time.Second)
	if err := cl.C.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Logf("apiserver stopped for %v and started again", time.Since(down).Round(time.Second))
	time.Sleep(witnessInterval)
	live["same"] = second
	for name, ls := range live {
		cur, ok := w.lease(name)
		if !ok || cur.ContainerID != ls.ContainerID || cur.IPs[0] != ls.IPs[0] {
			t.Errorf("running pod %s lost its lease %s (%s): now %+v", name, ls.IPs[0], ls.ContainerID[:12], cur)
		}
		if r := w.released(name); r != nil {
			t.Errorf("running pod %s's address released: %s %s", name, r.Reason, r.Detail)
		}
	}
	if r := w.releasedAt(first); r == nil || r.Reason != "DEL" {
		t.Errorf("the first pod named same: release %+v, want its DEL", r)
	}
	t.Logf("never alone: %d running pods (one per node since the start, and same re-created under its name with UID %s) kept their addresses through the API's outage", len(live), second.UID)

	all := cl.C.MustKubectl(t, "get", "events", "-n", "default", "--field-selector", "involvedObject.kind=Pod")
	var b strings.Builder
	for i, line := range strings.Split(all, "\n") {
		if i == 0 || strings.Contains(line, "Address") {
			b.WriteString(line + "\n")
		}
	}
	out := b.String()
	t.Logf("kubectl get events -n default --field-selector involvedObject.kind=Pod (the agents' reasons):\n%s", out)
	for _, want := range []string{agent.ReasonAddressStranded, agent.ReasonAddressReleased, before.secondSandbox, after.deleted} {
		if !strings.Contains(out, want) {
			t.Errorf("no Event mentions %s", want)
		}
	}
	for _, nd := range cl.Nodes {
		os.Remove(nd.HostPath(filepath.Join(failDir, "fail-del")))
		if out, code := w.ctl(nd.Name, "audit"); code != 0 {
			t.Errorf("%s: audit exit %d:\n%s", nd.Name, code, out)
		}
	}
}

// failPlugin builds test/kube/failplugin into every node's CNI bin dir as
// ipledger-testfail and turns its DEL failure on (failDir/fail-del).
func (cl *cluster) failPlugin() {
	t := cl.T
	t.Helper()
	for _, nd := range cl.Nodes {
		cmd := exec.Command("go", "build", "-trimpath", "-o", nd.HostPath("/opt/cni/bin/ipledger-testfail"), "./test/kube/failplugin")
		cmd.Dir = agentenv.RepoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build failplugin: %v\n%s", err, out)
		}
		dir := nd.HostPath(failDir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "fail-del"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// witnessManifest is deploy/ipledger.yaml with the test plugin chained last
// (its DEL runs first, and while it fails no other plugin's DEL runs), the
// reconciler's interval and grace shortened, and --api-evidence=false unless
// apiEvidence.
func witnessManifest(t *testing.T, apiEvidence bool) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(agentenv.RepoRoot(), "deploy", "ipledger.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := string(raw)
	for _, r := range []struct{ old, new string }{
		{`{"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}`,
			`{"type": "portmap", "capabilities": {"portMappings": true}, "snat": true},
        {"type": "ipledger-testfail", "failDel": 1000000, "failPods": ["leak-"], "failDelWhile": "` + failDir + `/fail-del", "stateDir": "` + failDir + `"}`},
		{`"--reconcile-interval", "30s", "--release-grace", "60s",`,
			fmt.Sprintf(`"--reconcile-interval", "%v", "--release-grace", "%v", "--api-evidence=%v",`, witnessInterval, witnessGrace, apiEvidence)},
	} {
		if !strings.Contains(m, r.old) {
			t.Fatalf("deploy/ipledger.yaml has no %s", r.old)
		}
		m = strings.Replace(m, r.old, r.new, 1)
	}
	return m
}

// witness follows every node's leases (sampled) and reads their releases.
type witness struct {
	cl *cluster
	t  *testing.T

	mu   sync.Mutex
	seen map[string]seenLease // by pod name: the lease last seen
}

type seenLease struct {
	api.LeaseView
	node string
}

// sample polls every node's leases every 300 ms until the test ends, keeping
// the last lease seen of each pod.
func (w *witness) sample() {
	stop := make(chan struct{})
	done := make(chan struct{})
	w.t.Cleanup(func() { close(stop); <-done })
	go func() {
		defer close(done)
		for {
			for _, nd := range w.cl.Nodes {
				out, code := w.ctl(nd.Name, "leases", "-o", "json")
				var ls []api.LeaseView
				if code != 0 || json.Unmarshal([]byte(out), &ls) != nil {
					continue
				}
				w.mu.Lock()
				for _, l := range ls {
					if l.Name != "" {
						w.seen[l.Name] = seenLease{l, nd.Name}
					}
				}
				w.mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()
}

// ctl runs ipledgerctl against node's agent: stdout (and stderr) and the exit code.
func (w *witness) ctl(node string, args ...string) (string, int) {
	var nd *kubeenv.Node
	for _, n := range w.cl.Nodes {
		if n.Name == node {
			nd = n
		}
	}
	cmd := exec.Command(filepath.Join(agentenv.Bin(w.t), "ipledgerctl"), append([]string{"--socket", nd.HostPath("/run/ipledger/ipledger.sock")}, args...)...)
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out) + string(ee.Stderr), ee.ExitCode()
	}
	if err != nil {
		return err.Error(), -1
	}
	return string(out), 0
}

// lease is the pod's lease as its node's agent holds it now.
func (w *witness) lease(pod string) (api.LeaseView, bool) {
	w.mu.Lock()
	s, ok := w.seen[pod]
	w.mu.Unlock()
	if !ok {
		return api.LeaseView{}, false
	}
	out, code := w.ctl(s.node, "leases", "-o", "json")
	var ls []api.LeaseView
	if code != 0 || json.Unmarshal([]byte(out), &ls) != nil {
		w.t.Fatalf("%s: leases: %s", s.node, out)
	}
	for _, l := range ls {
		if l.Name == pod {
			return l, true
		}
	}
	return api.LeaseView{}, false
}

func (w *witness) forget(pod string) { w.mu.Lock(); delete(w.seen, pod); w.mu.Unlock() }

// waitRunning waits until the pod runs (its sandbox and container are
// recorded by the runtime).
func (w *witness) waitRunning(pod string) {
	w.t.Helper()
	if err := kubeenv.WaitFor(3*time.Minute, 200*time.Millisecond, func() (bool, error) {
		var p kubeenv.Pod
		if err := w.cl.C.GetJSON(&p, "pod", pod, "-n", "default"); err != nil {
			return false, err
		}
		return p.Status.Phase == "Running", fmt.Errorf("pod %s phase %q", pod, p.Status.Phase)
	}); err != nil {
		w.t.Fatal(err)
	}
}

// waitLease waits until the pod's lease has been seen.
func (w *witness) waitLease(pod string) seenLease {
	w.t.Helper()
	return w.waitLeaseOf(pod, func(seenLease) bool { return true })
}

// waitLeaseOf waits until a lease of the pod for which ok holds has been seen.
func (w *witness) waitLeaseOf(pod string, ok func(seenLease) bool) seenLease {
	w.t.Helper()
	var s seenLease
	if err := kubeenv.WaitFor(3*time.Minute, 200*time.Millisecond, func() (bool, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		var seen bool
		s, seen = w.seen[pod]
		return seen && ok(s), fmt.Errorf("no lease seen for pod %s", pod)
	}); err != nil {
		w.t.Fatal(err)
	}
	return s
}

// released is the release of the pod's last seen lease, nil while it is held.
func (w *witness) released(pod string) *api.Release {
	w.mu.Lock()
	s, ok := w.seen[pod]
	w.mu.Unlock()
	if !ok {
		w.t.Fatalf("no lease seen for pod %s", pod)
	}
	return w.releasedAt(s)
}

// releasedAt is the release of lease s, nil while it is held.
func (w *witness) releasedAt(s seenLease) *api.Release {
	ip := strings.Split(s.IPs[0], "/")[0]
	out, code := w.ctl(s.node, "history", "--network", s.Network, "--ip", ip, "-o", "json")
	var h []api.Release
	if code != 0 || json.Unmarshal([]byte(out), &h) != nil {
		w.t.Fatalf("%s: history of %s: %s", s.node, ip, out)
	}
	for i := range h {
		if h[i].Key.ContainerID == s.ContainerID {
			return &h[i]
		}
	}
	return nil
}

func (w *witness) waitReleased(pod string, timeout time.Duration) *api.Release {
	w.t.Helper()
	var r *api.Release
	if err := kubeenv.WaitFor(timeout, time.Second, func() (bool, error) {
		r = w.released(pod)
		return r != nil, fmt.Errorf("pod %s's lease not released", pod)
	}); err != nil {
		l, _ := w.lease(pod)
		w.t.Fatalf("%v: %+v", err, l)
	}
	return r
}

// stranded checks that the pod's lease is held and the reconciler reports it
// stranded.
func (w *witness) stranded(pod string) {
	w.t.Helper()
	if err := kubeenv.WaitFor(time.Minute, time.Second, func() (bool, error) {
		l, ok := w.lease(pod)
		return ok && l.Verdict == api.VerdictStranded, fmt.Errorf("pod %s's lease %+v (held %v), want stranded", pod, l, ok)
	}); err != nil {
		w.t.Fatal(err)
	}
}

// sleeper starts a pod that sleeps on node.
func (w *witness) sleeper(name, node string) {
	w.cl.C.Apply(w.t, nodesenv.PodManifest(name, nil, witnessPod(node, "sleep", "/bin/busybox", "sleep", "3600")))
}

// job starts a Job of one pod on node that exits 0 after two seconds.
func (w *witness) job(name, node string) {
	spec := witnessPod(node, "main", "/bin/busybox", "sleep", "2")
	spec.RestartPolicy = corev1.RestartPolicyNever
	w.cl.C.Apply(w.t, nodesenv.JobManifest(name, spec))
}

// witnessPod is busyboxPod with a grace of one second and no service
// variables.
func witnessPod(node, container string, command ...string) corev1.PodSpec {
	spec := nodesenv.BusyboxPod(node, container, command...)
	spec.TerminationGracePeriodSeconds = new(int64(1))
	spec.EnableServiceLinks = new(false)
	return spec
}

// jobPod waits until the Job's pod has Succeeded and returns its name and
// its container's exit time.
func (w *witness) jobPod(job string) (string, time.Time) {
	w.t.Helper()
	var name string
	var exit time.Time
	if err := kubeenv.WaitFor(3*time.Minute, 500*time.Millisecond, func() (bool, error) {
		var l struct {
			Items []struct {
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
				Status struct {
					Phase             string `json:"phase"`
					ContainerStatuses []struct {
						State struct {
							Terminated *struct {
								FinishedAt time.Time `json:"finishedAt"`
							} `json:"terminated"`
						} `json:"state"`
					} `json:"containerStatuses"`
				} `json:"status"`
			} `json:"items"`
		}
		if err := w.cl.C.GetJSON(&l, "pods", "-n", "default", "-l", "job="+job); err != nil {
			return false, err
		}
		for _, p := range l.Items {
			cs := p.Status.ContainerStatuses
			if p.Status.Phase == "Succeeded" && len(cs) == 1 && cs[0].State.Terminated != nil {
				name, exit = p.Metadata.Name, cs[0].State.Terminated.FinishedAt
				return true, nil
			}
		}
		return false, fmt.Errorf("job %s: no pod Succeeded", job)
	}); err != nil {
		w.t.Fatal(err)
	}
	return name, exit
}

// incident is one run of the two incidents and the control.
type incident struct {
	// the pods whose leases are stranded: seed 000's (its second sandbox's
	// lease) and seed 004's
	secondSandbox, deleted string
	// when the evidence began: the second sandbox stopped, containerd back
	stopped, ctrdBack time.Time
	done              time.Duration // the control Job pod: exit to release
}

// incidents runs, with suffix sfx: a control Job on node1 whose pod completes
// and is released by its DEL; seed 000's form on node1 (a Job pod that
// completes normally, then a second sandbox made for it, as the seed's kubelet
// did, whose teardown fails); and seed 004's form on node2 (a running pod
// deleted while containerd is stopped, whose teardown fails once containerd is
// back).
func (w *witness) incidents(sfx string) incident {
	w.t.Helper()
	var x incident
	node1, node2 := w.cl.Nodes[1], w.cl.Nodes[2]
	failing(w.t, node1, false)
	w.job("done-"+sfx, node1.Name)
	w.job("leak-job-"+sfx, node1.Name)
	del := "leak-deleted-" + sfx
	w.sleeper(del, node2.Name)
	w.waitLease(del)
	// Running, not only leased: the lease comes with the ADD, before containerd
	// has recorded the sandbox; stopped in between, the runtime forgets the
	// sandbox and the agent rightly releases it (containerd#10744's form).
	w.waitRunning(del)
	node2.StopContainerd()
	w.cl.C.MustKubectl(w.t, "delete", "pod", del, "--grace-period=0", "--force", "--wait=false")
	time.Sleep(2 * time.Second)
	if err := node2.StartContainerd(); err != nil {
		w.t.Fatal(err)
	}
	x.ctrdBack, x.deleted = time.Now(), del

	doneName, doneExit := w.jobPod("done-" + sfx)
	w.waitLease(doneName)
	r := w.waitReleased(doneName, time.Minute)
	x.done = r.To.Sub(doneExit)
	if r.Reason != "DEL" {
		w.t.Errorf("the control Job pod %s released by %s, want its DEL", doneName, r.Reason)
	}
	leakName, _ := w.jobPod("leak-job-" + sfx)
	w.waitLease(leakName)
	if r := w.waitReleased(leakName, time.Minute); r.Reason != "DEL" {
		w.t.Errorf("Job pod %s's first sandbox released by %s, want its DEL", leakName, r.Reason)
	}
	// The second sandbox: the Succeeded pod's metadata, attempt 1, with the
	// kubelet's labels; its teardown fails.
	var pod struct {
		Metadata struct {
			UID string `json:"uid"`
		} `json:"metadata"`
	}
	if err := w.cl.C.GetJSON(&pod, "pod", "-n", "default", leakName); err != nil {
		w.t.Fatal(err)
	}
	uid := pod.Metadata.UID
	failing(w.t, node1, true)
	ctx := w.t.Context()
	c, err := cri.Dial(ctx, node1.Endpoint(), 30*time.Second)
	if err != nil {
		w.t.Fatal(err)
	}
	defer c.Close()
	id, err := c.RunPodSandbox(ctx, cri.PodSpec{Namespace: "default", Name: leakName, UID: uid, Attempt: 1, LogDir: w.t.TempDir(),
		Labels: map[string]string{"io.kubernetes.pod.name": leakName, "io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.uid": uid}})
	if err != nil {
		w.t.Fatalf("second sandbox for %s: %v", leakName, err)
	}
	w.forget(leakName)
	w.waitLeaseOf(leakName, func(s seenLease) bool { return s.ContainerID == id })
	if err := c.StopPodSandbox(ctx, id); err == nil {
		w.t.Errorf("the second sandbox of %s stopped cleanly: its teardown should fail", leakName)
	}
	x.stopped, x.secondSandbox = time.Now(), leakName
	return x
}

// failing turns the test plugin's DEL failure on node on or off.
func failing(t *testing.T, nd *kubeenv.Node, on bool) {
	t.Helper()
	f := nd.HostPath(filepath.Join(failDir, "fail-del"))
	if !on {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return
	}
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}
