//go:build kubelet

package kubenodes_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/containerdenv"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
	"github.com/ipledger/ipledger/internal/testenv/nodesenv"
)

// checkRuntime: every node runs the containerd containerdenv selects (its CRI
// Version says so), the DaemonSet's install-cni wrote the conflist at the
// cniVersion that runtime loads (1.1.0 on containerd 2.x: the runtime calls
// STATUS and the Node follows the agent's readiness), and the apiserver admits
// a privileged pod, as a kubeadm cluster's does (--allow-privileged=true: the
// network tests that need one run here).
func (cl *cluster) checkRuntime() {
	t := cl.T
	t.Helper()
	want, err := containerdenv.Selected()
	if err != nil {
		t.Fatal(err)
	}
	wantVersion, wantCNI := "v"+want, "1.0.0"
	if want == containerdenv.Debian {
		wantVersion = "1.6."
	}
	if containerdenv.Major(want) >= 2 {
		wantCNI = "1.1.0"
	}
	for _, nd := range cl.Nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c, err := cri.Dial(ctx, nd.Endpoint(), 30*time.Second)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", nd.Name, err)
		}
		v, err := c.Version(context.Background())
		c.Close()
		if err != nil {
			t.Fatalf("%s: %v", nd.Name, err)
		}
		if v.Name != "containerd" || !strings.HasPrefix(v.Version, wantVersion) {
			t.Errorf("%s runs %s %s, want containerd %s (%s)", nd.Name, v.Name, v.Version, want, containerdenv.VersionEnv)
		}
		b, err := os.ReadFile(nd.HostPath("/etc/cni/net.d/10-ipledger.conflist"))
		if err != nil {
			t.Fatalf("%s: the installed conflist: %v", nd.Name, err)
		}
		var conf struct {
			CNIVersion string `json:"cniVersion"`
		}
		if err := json.Unmarshal(b, &conf); err != nil {
			t.Fatalf("%s: the installed conflist: %v", nd.Name, err)
		}
		if conf.CNIVersion != wantCNI {
			t.Errorf("%s: install-cni wrote cniVersion %q on %s %s, want %s", nd.Name, conf.CNIVersion, v.Name, v.Version, wantCNI)
		}
		t.Logf("%s: %s %s, conflist cniVersion %s", nd.Name, v.Name, v.Version, conf.CNIVersion)
	}
	priv := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"privileged","namespace":"default"},
"spec":{"containers":[{"name":"c","image":"` + nodesenv.PodImage + `","securityContext":{"privileged":true}}]}}`
	if out, err := cl.C.KubectlIn([]byte(priv), "create", "--dry-run=server", "-f", "-"); err != nil {
		t.Errorf("a privileged pod is refused: %v\n%s", err, out)
	}
}

// nodeState is a Node's Ready condition and its taints.
type nodeState struct {
	Ready, Reason, Message string
	Taints                 []string // key:effect
}

func (cl *cluster) nodeState(name string) (nodeState, error) {
	var node struct {
		Spec struct {
			Taints []struct{ Key, Effect string } `json:"taints"`
		} `json:"spec"`
		Status struct {
			Conditions []struct{ Type, Status, Reason, Message string } `json:"conditions"`
		} `json:"status"`
	}
	var st nodeState
	if err := cl.C.GetJSON(&node, "node", name); err != nil {
		return st, err
	}
	for _, c := range node.Status.Conditions {
		if c.Type == "Ready" {
			st.Ready, st.Reason, st.Message = c.Status, c.Reason, c.Message
		}
	}
	for _, t := range node.Spec.Taints {
		st.Taints = append(st.Taints, t.Key+":"+t.Effect)
	}
	return st, nil
}

// waitNodes polls every node until cond holds for it; it returns each node's
// state then and how long after t0 it first held.
func (cl *cluster) waitNodes(t0 time.Time, what string, cond func(nodeState) bool) (map[string]nodeState, map[string]time.Duration) {
	t := cl.T
	t.Helper()
	states, took := map[string]nodeState{}, map[string]time.Duration{}
	if err := kubeenv.WaitFor(3*time.Minute, 200*time.Millisecond, func() (bool, error) {
		for _, nd := range cl.Nodes {
			if _, done := took[nd.Name]; done {
				continue
			}
			st, err := cl.nodeState(nd.Name)
			if err != nil {
				return false, err
			}
			if cond(st) {
				states[nd.Name], took[nd.Name] = st, time.Since(t0)
			}
		}
		return len(took) == len(cl.Nodes), fmt.Errorf("%d of %d nodes", len(took), len(cl.Nodes))
	}); err != nil {
		t.Fatalf("%s: %v\nkubelet of %s:\n%s", what, err, cl.Nodes[0].Name, cl.Nodes[0].Log("kubelet", 20))
	}
	return states, took
}

// agentsAnswer reports whether every node's agent accepts a connection on the
// node's /run/ipledger/ipledger.sock.
func (cl *cluster) agentsAnswer() (up, down int) {
	for _, nd := range cl.Nodes {
		c, err := net.DialTimeout("unix", nd.HostPath("/run/ipledger/ipledger.sock"), time.Second)
		if err != nil {
			down++
			continue
		}
		c.Close()
		up++
	}
	return up, down
}

// describeReady is the Ready line of `kubectl describe node name`.
func (cl *cluster) describeReady(name string) string {
	out, err := cl.C.Kubectl("describe", "node", name)
	if err != nil {
		cl.T.Fatal(err)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "Ready ") {
			return strings.Join(strings.Fields(l), " ")
		}
	}
	cl.T.Fatalf("kubectl describe node %s: no Ready line:\n%s", name, out)
	return ""
}

// checkStatusDrivesNodes (issue 33): on a containerd that loads cniVersion
// 1.1.0 the runtime calls ipledger's STATUS from the kubelet's runtime status
// poll, so the Nodes follow the agents. With the agents gone (the DaemonSet
// deleted), every Node turns NotReady with "container runtime network not
// ready" and ipledger's message, the node lifecycle controller taints it
// not-ready:NoSchedule and a new pod is not scheduled; with the DaemonSet back
// every Node turns Ready and the pod runs. Both delays are measured per node
// from the moment no agent (every agent) answers on its socket. On containerd
// 1.6 and 1.7 (cniVersion 1.0.0) the Nodes do not follow the agents and
// nothing is asserted here (checkRuntime asserts the cniVersion).
func (cl *cluster) checkStatusDrivesNodes() {
	t := cl.T
	t.Helper()
	v, err := containerdenv.Selected()
	if err != nil {
		t.Fatal(err)
	}
	if containerdenv.Major(v) < 2 {
		t.Logf("containerd %s: cniVersion 1.0.0, STATUS never called: the Nodes do not follow the agents", v)
		return
	}
	cl.C.MustKubectl(t, "delete", "daemonset", "-n", "ipledger", "ipledgerd", "--wait=false")
	if err := kubeenv.WaitFor(2*time.Minute, 100*time.Millisecond, func() (bool, error) {
		up, _ := cl.agentsAnswer()
		return up == 0, fmt.Errorf("%d agents still answer", up)
	}); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	states, took := cl.waitNodes(down, "agents down", func(s nodeState) bool { return s.Ready == "False" })
	for _, nd := range cl.Nodes {
		st := states[nd.Name]
		t.Logf("%s: agent down -> NotReady in %v: %s", nd.Name, took[nd.Name].Round(time.Millisecond), st.Message)
		// ipledger's STATUS says the agent is not reachable, or, when the
		// runtime asked while the agent was exiting, that it gave no answer
		if !strings.Contains(st.Message, "container runtime network not ready") ||
			!(strings.Contains(st.Message, "ipledgerd is not reachable") || strings.Contains(st.Message, "ipledgerd on /run/ipledger/ipledger.sock gave no answer")) {
			t.Errorf("%s NotReady without the runtime's network condition and ipledger's message: %q", nd.Name, st.Message)
		}
	}
	t.Logf("kubectl describe node %s (agent down): %s", cl.Nodes[0].Name, cl.describeReady(cl.Nodes[0].Name))
	states, took = cl.waitNodes(down, "not-ready taint", func(s nodeState) bool {
		return slices.Contains(s.Taints, "node.kubernetes.io/not-ready:NoSchedule")
	})
	t.Logf("%s: taints %v, %v after the agent stopped", cl.Nodes[0].Name, states[cl.Nodes[0].Name].Taints, took[cl.Nodes[0].Name].Round(time.Millisecond))

	// A pod created meanwhile is not scheduled; the scheduler says why.
	spec := nodesenv.BusyboxPod("", "main", "/bin/busybox", "sleep", "100000")
	spec.TerminationGracePeriodSeconds = new(int64(0))
	cl.C.Apply(t, nodesenv.PodManifest("wait-ready", map[string]string{"app": "wait-ready"}, spec))
	var why string
	if err := kubeenv.WaitFor(time.Minute, 300*time.Millisecond, func() (bool, error) {
		pods, err := cl.C.Pods("default", "app=wait-ready")
		if err != nil || len(pods) != 1 {
			return false, fmt.Errorf("%d pods (%v)", len(pods), err)
		}
		for _, c := range pods[0].Status.Conditions {
			if c.Type == "PodScheduled" {
				why = c.Reason + ": " + c.Message
				return c.Status == "False", fmt.Errorf("PodScheduled %s %s", c.Status, why)
			}
		}
		return false, fmt.Errorf("no PodScheduled condition yet (%s)", pods[0].Status.Phase)
	}); err != nil {
		t.Fatalf("a pod created while the Nodes are NotReady: %v", err)
	}
	// The scheduler names no taint key ("3 node(s) had untolerated
	// taint(s)"); the one the Nodes carry is the not-ready taint waited for above.
	if !strings.Contains(why, "untolerated taint") {
		t.Errorf("pod not scheduled, but not for a taint: %s", why)
	}
	t.Logf("pod created while NotReady: PodScheduled=False %s", why)

	manifest, err := os.ReadFile(filepath.Join(agentenv.RepoRoot(), "deploy", "ipledger.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cl.C.Apply(t, string(manifest))
	if err := kubeenv.WaitFor(3*time.Minute, 100*time.Millisecond, func() (bool, error) {
		_, down := cl.agentsAnswer()
		return down == 0, fmt.Errorf("%d agents do not answer", down)
	}); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	states, took = cl.waitNodes(up, "agents back", func(s nodeState) bool { return s.Ready == "True" })
	for _, nd := range cl.Nodes {
		t.Logf("%s: agent up -> Ready in %v: %s", nd.Name, took[nd.Name].Round(time.Millisecond), states[nd.Name].Message)
	}
	t.Logf("kubectl describe node %s (agent back): %s", cl.Nodes[0].Name, cl.describeReady(cl.Nodes[0].Name))
	if err := kubeenv.WaitFor(2*time.Minute, 500*time.Millisecond, func() (bool, error) {
		pods, err := cl.C.Pods("default", "app=wait-ready")
		if err != nil || len(pods) != 1 {
			return false, fmt.Errorf("%d pods (%v)", len(pods), err)
		}
		return pods[0].Ready(), fmt.Errorf("pod %s", pods[0].Status.Phase)
	}); err != nil {
		t.Fatalf("the pending pod after the Nodes turned Ready: %v", err)
	}
	cl.C.MustKubectl(t, "delete", "pod", "wait-ready", "--wait=true")
	cl.WaitAgents("deploy/ipledger.yaml applied again", up)
}
