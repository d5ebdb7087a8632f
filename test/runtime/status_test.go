package runtime_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/ipledger/ipledger/internal/testenv"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/containerdenv"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// networkReady asks the runtime's CRI Status (what the kubelet polls) for its
// NetworkReady condition.
func networkReady(t *testing.T, rt runtimeapi.RuntimeServiceClient) (bool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := rt.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatalf("CRI Status: %v", err)
	}
	for _, c := range st.GetStatus().GetConditions() {
		if c.GetType() == runtimeapi.NetworkReady {
			return c.GetStatus(), c.GetReason() + ": " + c.GetMessage()
		}
	}
	t.Fatalf("CRI Status has no %s condition: %v", runtimeapi.NetworkReady, st)
	return false, ""
}

// statusCalls is the agent's count of STATUS requests answered ok
// (ipledger_requests_total{verb="status",result="ok"}).
func statusCalls(t *testing.T, metrics string) int {
	t.Helper()
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "ipledger_requests_total{") && strings.Contains(l, `verb="status"`) && strings.Contains(l, `result="ok"`) {
			f := strings.Fields(l)
			n, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("metrics line %q: %v", l, err)
			}
			return int(n)
		}
	}
	return 0
}

// statusWorld is a real containerd whose only network is ipledger's, installed
// by ipledgerd install-cni (which asks the runtime its version), and the agent.
type statusWorld struct {
	t       *testing.T
	env     *containerdenv.Env
	agent   *agentenv.Agent
	rt      runtimeapi.RuntimeServiceClient
	metrics string
	// cniVersion is what install-cni wrote for this runtime.
	cniVersion string
}

// newStatusWorld starts containerd and the agent (with agentArgs), then runs
// install-cni with a conflist whose ranges are ranges, and waits until the
// runtime loaded it (NetworkReady has left "cni config uninitialized").
func newStatusWorld(t *testing.T, ranges string, agentArgs ...string) *statusWorld {
	t.Helper()
	testenv.SkipIfShort(t, "needs containerd")
	bin := agentenv.Bin(t)
	cniBin, confDir := t.TempDir(), t.TempDir()
	if err := os.Symlink(filepath.Join(containerdenv.DefaultCNIBinDir, "loopback"), filepath.Join(cniBin, "loopback")); err != nil {
		t.Fatal(err)
	}
	env := containerdenv.Start(t, containerdenv.Options{CNIConfDir: confDir, CNIBinDir: cniBin, CallTimeout: 10 * time.Second})
	w := &statusWorld{t: t, env: env, metrics: netenv.FreeAddr(t)}
	w.agent = agentenv.Start(t, agentenv.Options{Args: append([]string{"--cri-endpoint", env.Endpoint(), "--metrics-addr", w.metrics}, agentArgs...)})

	conflist := filepath.Join(t.TempDir(), "ipledger.conflist")
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"statusnet","plugins":[{"type":"ipledger-veth","ipam":%s}]}`, w.agent.IPAM(ranges))
	if err := os.WriteFile(conflist, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(bin, "ipledgerd"), "install-cni", "--src-dir", bin, "--plugins", "ipledger,ipledger-veth",
		"--shared-plugins", "", "--conflist", conflist, "--cni-bin-dir", cniBin, "--cni-conf-dir", confDir,
		"--cri-endpoint", env.Endpoint()).CombinedOutput()
	if err != nil {
		t.Fatalf("install-cni: %v\n%s", err, out)
	}
	t.Logf("containerd %s; install-cni:\n%s", env.Version(), out)
	w.cniVersion = "1.0.0"
	if containerdenv.Major(env.Version()) >= 2 {
		w.cniVersion = "1.1.0"
	}
	if !strings.Contains(string(out), "cniVersion "+w.cniVersion+": containerd") {
		t.Fatalf("install-cni on containerd %s did not write cniVersion %s:\n%s", env.Version(), w.cniVersion, out)
	}
	cc, err := grpc.NewClient(env.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	w.rt = runtimeapi.NewRuntimeServiceClient(cc)
	// The runtime loads the conflist on its directory's fsnotify event.
	// Loaded: NetworkReady true, or false with the plugin's own error.
	if err := kubeWaitFor(2*time.Minute, func() error {
		ok, msg := networkReady(t, w.rt)
		if !ok && !strings.Contains(msg, "Network plugin returns error") {
			return fmt.Errorf("%s", msg)
		}
		return nil
	}); err != nil {
		t.Fatalf("the runtime did not load the conflist: %v\n%s", err, env.LogTail(30))
	}
	return w
}

// kubeWaitFor polls cond every 100 ms until it returns nil or timeout passes.
func kubeWaitFor(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitReady waits until the runtime's NetworkReady is want; it returns the
// condition's reason and message then and how long that took.
func (w *statusWorld) waitReady(want bool, what string) (string, time.Duration) {
	w.t.Helper()
	return w.waitStatus(want, what)
}

// waitStatus is waitReady until the runtime's message also holds each of has:
// a state reached through another (a usePodCidr agent says first that its Node
// watch has not listed yet, then that the Node has no podCIDR).
func (w *statusWorld) waitStatus(want bool, what string, has ...string) (string, time.Duration) {
	w.t.Helper()
	t0 := time.Now()
	for {
		ok, msg := networkReady(w.t, w.rt)
		if ok == want && containsAll(msg, has) {
			return msg, time.Since(t0)
		}
		if time.Since(t0) > 2*time.Minute {
			w.t.Fatalf("%s: NetworkReady %v after 2m, want %v with a message holding %q: %s\n%s", what, ok, want, has, msg, w.env.LogTail(30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestInstallCNIStatusOnRealRuntime: ipledgerd install-cni asks the real
// runtime its version and writes the cniVersion it loads: on containerd 2.x
// (2.0.1 and later) 1.1.0, and then every CRI Status call (the kubelet's
// runtime poll) runs ipledger's STATUS, which the agent answers (counted in
// its metrics); with the agent stopped the runtime's NetworkReady turns false
// with ipledger's message, and true again once the agent is back. On
// containerd 1.6 and 1.7 it writes 1.0.0, the runtime never calls STATUS and
// NetworkReady stays true with the agent down (what 1.1.0 ends).
func TestInstallCNIStatusOnRealRuntime(t *testing.T) {
	w := newStatusWorld(t, `[[{"subnet":"10.244.248.0/24"}]]`)
	env, agent, rt := w.env, w.agent, w.rt
	w.waitReady(true, "conflist installed, agent up")

	before := statusCalls(t, w.metrics)
	for range 3 {
		if ok, msg := networkReady(t, rt); !ok {
			t.Fatalf("NetworkReady false with the agent up: %s", msg)
		}
	}
	calls := statusCalls(t, w.metrics) - before
	if w.cniVersion == "1.0.0" {
		if calls != 0 {
			t.Fatalf("containerd %s with cniVersion 1.0.0 called STATUS %d times", env.Version(), calls)
		}
		if err := agent.Stop(); err != nil {
			t.Logf("agent stop: %v", err)
		}
		if ok, msg := networkReady(t, rt); !ok {
			t.Fatalf("containerd %s (cniVersion 1.0.0): NetworkReady false: %s", env.Version(), msg)
		}
		t.Logf("containerd %s: no STATUS, NetworkReady stays true with the agent down", env.Version())
		agent.Restart()
		return
	}
	if calls < 3 {
		t.Fatalf("3 CRI Status calls on containerd %s ran ipledger's STATUS %d times (agent's metrics)", env.Version(), calls)
	}
	t.Logf("3 CRI Status calls: %d STATUS requests answered by the agent", calls)

	if err := agent.Stop(); err != nil {
		t.Logf("agent stop: %v", err)
	}
	msg, _ := w.waitReady(false, "agent stopped")
	if !strings.Contains(msg, "ipledgerd is not reachable") {
		t.Errorf("NetworkReady false without ipledger's message: %q", msg)
	}
	t.Logf("agent stopped: NetworkReady false: %s", msg)
	agent.Restart()
	msg, _ = w.waitReady(true, "agent restarted")
	t.Logf("agent back: NetworkReady true %s", msg)
}

// TestStatusWaitsForPodCIDROnRealRuntime: with a usePodCidr conflist, while the
// agent's Node (on a real kube-apiserver) has no podCIDR, a runtime that calls
// STATUS (containerd 2.0.1 and later, cniVersion 1.1.0) reports NetworkReady
// false with ipledger's message naming the Node and the fix, which the kubelet
// puts in the Node's Ready condition; once kube-controller-manager's part is
// done (the podCIDR set) it turns true, within a CRI Status poll or two.
// On containerd 1.6 and 1.7 NetworkReady stays true (no STATUS).
func TestStatusWaitsForPodCIDROnRealRuntime(t *testing.T) {
	testenv.SkipIfShort(t, "needs a Kubernetes build and containerd")
	agentenv.Bin(t)
	apiserver := kubeenv.StartAPIServer(t, kubeenv.APIServerOptions{})
	const node = "status-node"
	nodeJSON := `{"apiVersion":"v1","kind":"Node","metadata":{"name":"` + node + `"}}`
	if out, err := apiserver.KubectlIn([]byte(nodeJSON), "create", "-f", "-"); err != nil {
		t.Fatalf("create Node: %v\n%s", err, out)
	}
	// --routes/--masquerade off: this agent runs in the host's namespace.
	w := newStatusWorld(t, `[[{"subnet":"usePodCidr"}]]`, "--node-name", node, "--kubeconfig", apiserver.Kubeconfig,
		"--routes=false", "--masquerade=false")
	if w.cniVersion == "1.0.0" {
		if ok, msg := networkReady(t, w.rt); !ok {
			t.Fatalf("containerd %s (cniVersion 1.0.0): NetworkReady false: %s", w.env.Version(), msg)
		}
		t.Logf("containerd %s: no STATUS, NetworkReady true while the Node has no podCIDR", w.env.Version())
		return
	}
	// Until the agent's Node watch has listed, its message says so; then it
	// names the Node and the podCIDR it lacks.
	msg, _ := w.waitStatus(false, "Node without a podCIDR", node, "podCIDR")
	t.Logf("Node %s without a podCIDR: NetworkReady false: %s", node, msg)
	if out, err := apiserver.Kubectl("patch", "node", node, "--type", "merge", "-p", `{"spec":{"podCIDR":"10.244.247.0/24","podCIDRs":["10.244.247.0/24"]}}`); err != nil {
		t.Fatalf("patch podCIDR: %v\n%s", err, out)
	}
	msg, took := w.waitReady(true, "podCIDR set")
	t.Logf("podCIDR set -> NetworkReady true in %v %s", took.Round(time.Millisecond), msg)
}
