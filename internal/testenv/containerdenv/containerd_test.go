package containerdenv_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/testenv/containerdenv"
)

// bridgeNet returns a conflist for a test-only bridge
// (no gateway, no masquerade, never routed off the machine) and deletes the
// bridge when the test ends. Register it before Start so the bridge outlives
// the env's own cleanup.
func bridgeNet(t *testing.T, bridge, subnet string) string {
	t.Helper()
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "link", "del", bridge).CombinedOutput(); err != nil &&
			!strings.Contains(string(out), "Cannot find device") {
			t.Logf("ip link del %s: %v: %s", bridge, err, out)
		}
	})
	return fmt.Sprintf(`{"cniVersion":"1.0.0","name":"testnet","plugins":[{"type":"bridge","bridge":%q,"isGateway":false,"ipMasq":false,"ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],"dataDir":%q}}]}`,
		bridge, subnet, t.TempDir())
}

func start(t *testing.T, bridge, subnet string) *containerdenv.Env {
	t.Helper()
	conf := bridgeNet(t, bridge, subnet)
	t0 := time.Now()
	env := containerdenv.Start(t, containerdenv.Options{Conflist: conf})
	t.Logf("containerd ready in %v at %s", time.Since(t0).Round(time.Millisecond), env.Endpoint())
	return env
}

func find(t *testing.T, c *cri.Client, id string) (cri.Sandbox, bool) {
	t.Helper()
	sbs, err := c.ListSandboxes(context.Background())
	if err != nil {
		t.Fatalf("ListSandboxes: %v", err)
	}
	for _, s := range sbs {
		if s.ID == id {
			return s, true
		}
	}
	return cri.Sandbox{}, false
}

func TestSandboxLifecycle(t *testing.T) {
	env := start(t, "ipltest0", "10.244.250.0/24")
	c := env.Client(t)
	ctx := context.Background()

	v, err := c.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v.Name != "containerd" || v.APIVersion != "v1" {
		t.Fatalf("Version = %+v, want containerd, v1", v)
	}

	before := time.Now().Add(-time.Second)
	pod := cri.PodSpec{Namespace: "ns1", Name: "pod-a", UID: "uid-a", Attempt: 0, Labels: map[string]string{"app": "a"}, LogDir: t.TempDir()}
	id, err := c.RunPodSandbox(ctx, pod)
	if err != nil {
		t.Fatalf("RunPodSandbox: %v\n%s", err, env.LogTail(30))
	}

	s, ok := find(t, c, id)
	if !ok {
		t.Fatalf("sandbox %s not listed", id)
	}
	if s.State != cri.StateReady || !s.Ready() {
		t.Fatalf("listed state = %v, want READY", s.State)
	}
	if s.Namespace != "ns1" || s.Name != "pod-a" || s.UID != "uid-a" || s.Attempt != 0 {
		t.Fatalf("listed metadata = %+v", s)
	}
	if s.Labels["app"] != "a" {
		t.Fatalf("labels = %v, want app=a", s.Labels)
	}
	if s.CreatedAt.Before(before) || s.CreatedAt.After(time.Now().Add(time.Second)) {
		t.Fatalf("CreatedAt = %v, not around now", s.CreatedAt)
	}

	st, err := c.SandboxStatus(ctx, id)
	if err != nil {
		t.Fatalf("SandboxStatus: %v", err)
	}
	if st.State != cri.StateReady || st.UID != "uid-a" || st.Name != "pod-a" {
		t.Fatalf("status = %+v", st)
	}
	if st.NetNSPath == "" {
		t.Fatal("status has no netns path")
	}
	if !strings.HasPrefix(st.NetNSPath, env.StateDir()+"/") {
		t.Errorf("netns path %s not under state dir %s", st.NetNSPath, env.StateDir())
	}
	if _, err := os.Stat(st.NetNSPath); err != nil {
		t.Fatalf("netns path: %v", err)
	}
	if len(st.IPs) != 1 || !strings.HasPrefix(st.IPs[0], "10.244.250.") {
		t.Fatalf("IPs = %v, want one in 10.244.250.0/24", st.IPs)
	}

	if err := c.StopPodSandbox(ctx, id); err != nil {
		t.Fatalf("StopPodSandbox: %v", err)
	}
	if s, ok := find(t, c, id); !ok || s.State != cri.StateNotReady {
		t.Fatalf("after stop: listed=%v state=%v, want NOTREADY", ok, s.State)
	}
	if st, err := c.SandboxStatus(ctx, id); err != nil || st.State != cri.StateNotReady {
		t.Fatalf("after stop: status %v, %v; want NOTREADY", st.State, err)
	}

	if err := c.RemovePodSandbox(ctx, id); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
	if _, ok := find(t, c, id); ok {
		t.Fatal("sandbox still listed after remove")
	}
	_, err = c.SandboxStatus(ctx, id)
	if !errors.Is(err, cri.ErrNotFound) {
		t.Fatalf("SandboxStatus after remove: %v, want ErrNotFound", err)
	}
	// containerd 1.x answers NotFound for an unknown sandbox; 2.x answers
	// success (StopPodSandbox is idempotent in the CRI API: stopping what is
	// not there is done).
	err = c.StopPodSandbox(ctx, "no-such-sandbox")
	if containerdenv.Major(env.Version()) >= 2 {
		if err != nil {
			t.Fatalf("containerd %s: StopPodSandbox(unknown) = %v, want success", env.Version(), err)
		}
	} else if !errors.Is(err, cri.ErrNotFound) {
		t.Fatalf("containerd %s: StopPodSandbox(unknown) = %v, want ErrNotFound", env.Version(), err)
	}
}

func TestKillRestart(t *testing.T) {
	env := start(t, "ipltest1", "10.244.251.0/24")
	c := env.Client(t)
	ctx := context.Background()

	id, err := c.RunPodSandbox(ctx, cri.PodSpec{Namespace: "ns1", Name: "pod-k", UID: "uid-k"})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	pid := env.PID()
	env.Kill()
	if env.PID() != 0 {
		t.Fatal("containerd still running after Kill")
	}
	if _, err := c.ListSandboxes(ctx); err == nil {
		t.Fatal("ListSandboxes succeeded with containerd killed")
	}
	// The socket file outlives a SIGKILL; Dial must still fail, naming it.
	if _, err := cri.Dial(ctx, env.Endpoint(), time.Second); err == nil || !strings.Contains(err.Error(), env.Endpoint()) {
		t.Fatalf("Dial with containerd killed: %v, want an error naming %s", err, env.Endpoint())
	}
	env.Restart(t)
	if p := env.PID(); p == 0 || p == pid {
		t.Fatalf("PID after restart = %d (before %d)", p, pid)
	}

	// The old client reconnects; the sandbox survived (its shim kept running).
	deadline := time.Now().Add(10 * time.Second)
	var s cri.Sandbox
	for {
		st, err := c.SandboxStatus(ctx, id)
		if err == nil {
			s = st
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("SandboxStatus after restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if s.State != cri.StateReady {
		t.Fatalf("after Kill+Restart state = %v, want READY", s.State)
	}

	// A second pod works, and a clean Stop + Restart too.
	id2, err := c.RunPodSandbox(ctx, cri.PodSpec{Namespace: "ns1", Name: "pod-k2", UID: "uid-k2"})
	if err != nil {
		t.Fatalf("RunPodSandbox after restart: %v", err)
	}
	if err := env.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	env.Restart(t)
	for _, x := range []string{id, id2} {
		if s, ok := find(t, c, x); !ok || s.State != cri.StateReady {
			t.Fatalf("sandbox %s after Stop+Restart: listed=%v state=%v", x, ok, s.State)
		}
	}

	// A reboot: state wiped, sandboxes come back NOTREADY, netns gone.
	st, err := c.SandboxStatus(ctx, id2)
	if err != nil {
		t.Fatal(err)
	}
	env.WipeState(t)
	if _, err := os.Stat(st.NetNSPath); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("netns %s after WipeState: %v, want gone", st.NetNSPath, err)
	}
	env.Restart(t)
	for _, x := range []string{id, id2} {
		if s, ok := find(t, c, x); !ok || s.State != cri.StateNotReady {
			t.Fatalf("sandbox %s after reboot: listed=%v state=%v, want NOTREADY", x, ok, s.State)
		}
		if err := c.RemovePodSandbox(ctx, x); err != nil {
			t.Fatalf("RemovePodSandbox after reboot: %v", err)
		}
	}
	id3, err := c.RunPodSandbox(ctx, cri.PodSpec{Namespace: "ns1", Name: "pod-k3", UID: "uid-k3"})
	if err != nil {
		t.Fatalf("RunPodSandbox after reboot: %v", err)
	}
	if s, ok := find(t, c, id3); !ok || !s.Ready() {
		t.Fatalf("sandbox after reboot: listed=%v state=%v", ok, s.State)
	}
}

func TestCNIBinDirsMerged(t *testing.T) {
	extra := t.TempDir()
	if err := os.WriteFile(filepath.Join(extra, "myplugin"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	env := containerdenv.Start(t, containerdenv.Options{CNIBinDirs: []string{extra}})
	for _, p := range []string{"myplugin", "bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(env.CNIBinDir(), p)); err != nil {
			t.Errorf("plugin %s not in merged bin dir: %v", p, err)
		}
	}
}

// TestCleanupKillsOrphanedShim: containerd killed while it deletes a sandbox's task
// leaves the shim running in a bundle it had renamed to ".ID" (seen after `make demo`,
// whose faults kill containerd mid-churn: a shim left on the machine for the next
// session). The env's cleanup must stop that shim and its pause too: found by the
// env's socket on the shim's command line, since no bundle names it any more.
func TestCleanupKillsOrphanedShim(t *testing.T) {
	var shims []int
	var pause int
	var cg []byte      // the pause's /proc/PID/cgroup
	t.Cleanup(func() { // whatever the outcome, nothing of this test outlives it
		for _, p := range append(shims, pause) {
			if p > 0 && containerdenv.Alive(p) {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
	})
	t.Run("env", func(t *testing.T) {
		env := start(t, "ipltest2", "10.244.253.0/24")
		c := env.Client(t)
		id, err := c.RunPodSandbox(context.Background(), cri.PodSpec{Namespace: "ns1", Name: "pod-o", UID: "uid-o"})
		if err != nil {
			t.Fatalf("RunPodSandbox: %v", err)
		}
		if shims = env.ShimPIDs(); len(shims) != 1 {
			t.Fatalf("shims of this env: %v, want one", shims)
		}
		bundle := filepath.Join(env.StateDir(), "io.containerd.runtime.v2.task", "k8s.io", id)
		b, err := os.ReadFile(filepath.Join(bundle, "init.pid"))
		if err != nil {
			t.Fatal(err)
		}
		if pause, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil || !containerdenv.Alive(pause) {
			t.Fatalf("pause pid %q: %v", b, err)
		}
		if cg, err = os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pause)); err != nil {
			t.Fatal(err)
		}
		// containerd's task delete renames the bundle to ".ID" and removes it, and
		// then has the shim exit; killed in between, it leaves the shim running in a
		// deleted directory, where the leaked one was found. The rootfs is unmounted
		// first, as containerd does: the removal must not reach into the image.
		env.Kill()
		gone := filepath.Join(filepath.Dir(bundle), "."+id)
		if err := os.Rename(bundle, gone); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Unmount(filepath.Join(gone, "rootfs"), syscall.MNT_DETACH); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(gone); err != nil {
			t.Fatal(err)
		}
	})
	for _, p := range append(shims, pause) {
		if containerdenv.Alive(p) {
			t.Errorf("pid %d (%s) still runs after the env's cleanup", p, containerdenv.Cmdline(p))
			_ = syscall.Kill(p, syscall.SIGKILL) // before its cgroup is checked and removed below
			for try := 0; try < 300 && containerdenv.Alive(p); try++ {
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	// and its cgroup is gone from every hierarchy (lines "N:controllers:/path")
	for _, line := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || f[2] == "/" {
			continue
		}
		left, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", f[2])) // v1 and hybrid
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", f[2])); err == nil {
			left = append(left, filepath.Join("/sys/fs/cgroup", f[2])) // v2
		}
		for _, d := range left {
			t.Errorf("the pause's cgroup is left: %s", d)
			// a task killed just now may still be leaving it: retry, bounded
			for try := 0; try < 100 && syscall.Rmdir(d) == syscall.EBUSY; try++ {
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
}
