//go:build kubelet

package kubeenv_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// TestClusterComesUpAndLeavesTheHostAsItWas starts the one-node cluster, checks
// the version stamp and the node's registration, and once it is stopped (still
// holding the host-wide lock) that the kubelet's sysctls are back and no
// kubepods cgroup is left.
func TestClusterComesUpAndLeavesTheHostAsItWas(t *testing.T) {
	t0 := time.Now()
	var c *kubeenv.Cluster
	c = kubeenv.Start(t, kubeenv.Options{AfterRestore: func() {
		for s, v := range c.SysctlsBefore() {
			b, _ := os.ReadFile("/proc/sys/" + s)
			if strings.TrimSpace(string(b)) != v {
				t.Errorf("sysctl %s is %q after the cluster, was %q", s, b, v)
			}
		}
		if left, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods"); len(left) > 0 {
			t.Errorf("kubepods cgroups left: %v", left)
		}
		if _, err := os.Stat(c.Dir); !os.IsNotExist(err) {
			t.Errorf("the cluster's directory %s is still there after the cleanup (stat: %v)", c.Dir, err)
		}
		ents, _ := os.ReadDir("/var/log/containers")
		for _, e := range ents {
			if target, err := os.Readlink(filepath.Join("/var/log/containers", e.Name())); err == nil && strings.HasPrefix(target, c.Dir+"/") {
				t.Errorf("kubelet's log link left: %s -> %s", e.Name(), target)
			}
		}
	}})
	t.Logf("cluster up (node registered) in %v", time.Since(t0).Round(time.Millisecond))
	out := c.MustKubectl(t, "version", "-o", "json")
	if strings.Count(out, `"gitVersion": "`+kubeenv.Version+`"`) != 2 {
		t.Fatalf("kubectl version does not report %s for client and server:\n%s", kubeenv.Version, out)
	}
	// No CNI config yet: the node is registered but not Ready.
	out = c.MustKubectl(t, "get", "node", c.NodeName, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}")
	if out != "False" && out != "Unknown" {
		t.Fatalf("node Ready=%q without a CNI config", out)
	}
}

// TestAPIServerOnlyRestartsByPIDAndKeepsItsData: the apiserver-only mode serves
// the API on loopback; Restart (and Kill then Start) replaces the kube-apiserver
// process (a new PID) on the same address with etcd's data kept; at cleanup both processes are
// stopped by PID (the runner checks they exited) and the directory removed.
func TestAPIServerOnlyRestartsByPIDAndKeepsItsData(t *testing.T) {
	t0 := time.Now()
	a := kubeenv.StartAPIServer(t, kubeenv.APIServerOptions{})
	t.Logf("apiserver up in %v at %s", time.Since(t0).Round(time.Millisecond), a.URL)
	if !strings.HasPrefix(a.URL, "https://127.0.0.1:") || !strings.HasPrefix(a.EtcdURL, "http://127.0.0.1:") {
		t.Fatalf("not on loopback: %s, %s", a.URL, a.EtcdURL)
	}
	if out, err := a.Kubectl("create", "namespace", "kept"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	pid := a.PID()
	t1 := time.Now()
	if err := a.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("apiserver restarted in %v", time.Since(t1).Round(time.Millisecond))
	if a.PID() == pid || a.PID() == 0 {
		t.Fatalf("pid %d after restart, was %d", a.PID(), pid)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("the old kube-apiserver (pid %d) still runs", pid)
	}
	if out, err := a.Kubectl("get", "namespace", "kept", "-o", "name"); err != nil || strings.TrimSpace(out) != "namespace/kept" {
		t.Fatalf("namespace after restart: %q, %v", out, err)
	}
	if err := a.Start(); err == nil {
		t.Fatal("Start of a running apiserver succeeded")
	}
	// Kill: a crash (SIGKILL); Start brings it back with the data.
	pid = a.PID()
	a.Kill()
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("the killed kube-apiserver (pid %d) still runs", pid)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	if out, err := a.Kubectl("get", "namespace", "kept", "-o", "name"); err != nil || strings.TrimSpace(out) != "namespace/kept" {
		t.Fatalf("namespace after kill and start: %q, %v", out, err)
	}
}

// TestExtraBinaryKubeProxy: kube-proxy is built apart from the Commands (their
// stamp unchanged) and reports the pinned version.
func TestExtraBinaryKubeProxy(t *testing.T) {
	stamp := filepath.Join(kubeenv.CacheDir(), "bin", ".stamp")
	before, _ := os.ReadFile(stamp)
	t0 := time.Now()
	p := kubeenv.ExtraBinary(t, "kube-proxy")
	t.Logf("kube-proxy at %s in %v", p, time.Since(t0).Round(time.Millisecond))
	out, err := exec.Command(p, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), kubeenv.Version) {
		t.Fatalf("%s --version: %v: %s", p, err, out)
	}
	if after, _ := os.ReadFile(stamp); string(after) != string(before) {
		t.Errorf("the Commands' stamp changed: %q -> %q", before, after)
	}
}
