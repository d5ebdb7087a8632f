package reconcile

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestRuntimeMounts: the agent is found in the runtime's mount namespace when the
// process serving the CRI socket is in its own (here the test serves it), not when
// nothing serves the socket; a process in another mount namespace is told apart.
func TestRuntimeMounts(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "cri.sock")
	if ok, why := RuntimeMounts("unix://" + sock)(); ok {
		t.Fatalf("no runtime: %v %s", ok, why)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if ok, why := RuntimeMounts("unix://" + sock)(); !ok || !strings.Contains(why, "mount namespace of the runtime") {
		t.Fatalf("runtime in the agent's mount namespace: %v %q", ok, why)
	}
	if pid, err := peerPID(sock); err != nil || pid != os.Getpid() {
		t.Fatalf("peerPID = %d, %v; want %d", pid, err, os.Getpid())
	}
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if sameMountNS(cmd.Process.Pid) {
		t.Fatal("a process in another mount namespace is said to share the agent's")
	}
	if !sameMountNS(os.Getpid()) {
		t.Fatal("the agent's own process is said not to share its mount namespace")
	}
}
