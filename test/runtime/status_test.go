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

// TestInstallCNIStatusOnRealRuntime: ipledgerd install-cni asks the real
// runtime its version and writes the cniVersion it loads: on containerd 2.x
// (2.0.1 and later) 1.1.0, and then every CRI Status call (the kubelet's
// runtime poll) runs ipledger's STATUS, which the agent answers (counted in
// its metrics); with the agent stopped the runtime's NetworkReady turns false
// with ipledger's message, and true again once the agent is back. On
// containerd 1.6 and 1.7 it writes 1.0.0, the runtime never calls STATUS and
// NetworkReady stays true with the agent down (what 1.1.0 ends).
func TestInstallCNIStatusOnRealRuntime(t *testing.T) {
	testenv.SkipIfShort(t, "needs containerd")
	bin := agentenv.Bin(t)
	cniBin, confDir := t.TempDir(), t.TempDir()
	if err := os.Symlink(filepath.Join(containerdenv.DefaultCNIBinDir, "loopback"), filepath.Join(cniBin, "loopback")); err != nil {
		t.Fatal(err)
	}
	env := containerdenv.Start(t, containerdenv.Options{CNIConfDir: confDir, CNIBinDir: cniBin, CallTimeout: 10 * time.Second})
	metrics := netenv.FreeAddr(t)
	agent := agentenv.Start(t, agentenv.Options{Args: []string{"--cri-endpoint", env.Endpoint(), "--metrics-addr", metrics}})

	conflist := filepath.Join(t.TempDir(), "ipledger.conflist")
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"statusnet","plugins":[{"type":"ipledger-veth","ipam":%s}]}`,
		agent.IPAM(`[[{"subnet":"10.244.248.0/24"}]]`))
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
	want := "1.0.0"
	if containerdenv.Major(env.Version()) >= 2 {
		want = "1.1.0"
	}
	if !strings.Contains(string(out), "cniVersion "+want+": containerd") {
		t.Fatalf("install-cni on containerd %s did not write cniVersion %s:\n%s", env.Version(), want, out)
	}

	cc, err := grpc.NewClient(env.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	rt := runtimeapi.NewRuntimeServiceClient(cc)
	// The runtime loads the conflist on its directory's fsnotify event.
	waitReady := func(want bool, what string) (string, time.Duration) {
		t.Helper()
		t0 := time.Now()
		for {
			ok, msg := networkReady(t, rt)
			if ok == want {
				return msg, time.Since(t0)
			}
			if time.Since(t0) > 2*time.Minute {
				t.Fatalf("%s: NetworkReady still %v after 2m: %s\n%s", what, ok, msg, env.LogTail(30))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitReady(true, "conflist installed, agent up")

	before := statusCalls(t, metrics)
	for range 3 {
		if ok, msg := networkReady(t, rt); !ok {
			t.Fatalf("NetworkReady false with the agent up: %s", msg)
		}
	}
	calls := statusCalls(t, metrics) - before
	if want == "1.0.0" {
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
	msg, _ := waitReady(false, "agent stopped")
	if !strings.Contains(msg, "ipledgerd is not reachable") {
		t.Errorf("NetworkReady false without ipledger's message: %q", msg)
	}
	t.Logf("agent stopped: NetworkReady false: %s", msg)
	agent.Restart()
	msg, _ = waitReady(true, "agent restarted")
	t.Logf("agent back: NetworkReady true %s", msg)
}
