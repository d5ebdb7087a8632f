package reconcile

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/memstore"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// bindNS bind-mounts a new network namespace onto dir/name (as a runtime does in
// its netns directory) and returns its identity as ADD records it; unmounted at
// cleanup.
func bindNS(t *testing.T, dir, name string) ledger.NetNS {
	t.Helper()
	src := netenv.Namespace(t, "iplvis")
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(src.Path, path, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind %s on %s: %v", src.Path, path, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(path, unix.MNT_DETACH) })
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return ledger.NetNS{Path: path, Dev: st.Dev, Ino: st.Ino}
}

// visFixture is a reconciler with the real probe and a boot clock.
type visFixture struct {
	*fixture
	boot *clocktest.Boot
}

func newVisFixture(t *testing.T, mounts func() (bool, string)) *visFixture {
	t.Helper()
	clk := clocktest.New()
	boot := clocktest.NewBoot("boot-1", time.Hour)
	l := ledgertest.Open(t, memstore.New(), ledger.Options{Clock: clk, Boot: boot})
	f := &fixture{t: t, clk: clk, l: l, rt: newFakeRuntime(), ctx: t.Context()}
	r, err := New(Options{Ledger: l, Runtime: f.rt, Netns: NSFS{}, Interval: interval, Grace: grace, Clock: clk, Boot: boot, Mounts: mounts, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	f.r = r
	return &visFixture{f, boot}
}

// alloc allocates a lease for sandbox id in namespace ns, the runtime reporting st.
func (v *visFixture) alloc(id string, ns ledger.NetNS, st cri.State) ledger.Lease {
	v.t.Helper()
	v.boot.Advance(time.Second) // each allocated after the one before
	ls, _, err := v.l.Allocate(ledger.AllocateRequest{Key: key(id), Pod: ledger.Pod{UID: "u-" + id}, NetNS: ns, Ranges: ranges})
	if err != nil {
		v.t.Fatal(err)
	}
	v.rt.set(id, st)
	return ls
}

// TestNotVisibleKept: a NOTREADY sandbox's namespace the agent cannot see (the
// mount point without its mount, as a container without mount propagation sees
// it; a path or a directory missing) is kept by the reconciler and by the guard
// (supersede and GC), and shown suspect as not visible. The same observations
// with positive evidence (a READY sandbox's namespace in the same directory, made
// since, that the agent sees; another boot) release it.
func TestNotVisibleKept(t *testing.T) {
	other := realNS(t, "10.99.4.1/32") // an nsfs identity to record
	for _, c := range []struct {
		name string
		// setup returns the judged lease's NetNS and allocates any witness
		setup   func(t *testing.T, v *visFixture, dir string) ledger.NetNS
		witness bool // a witness is allocated after the judged lease
		reboot  bool
		mounts  bool // the agent is in the runtime's mount namespace
		gone    bool
	}{
		{name: "plain file on another filesystem", setup: plainFile},
		{name: "path missing, directory there", setup: missingPath},
		{name: "directory missing, parent there", setup: func(t *testing.T, v *visFixture, dir string) ledger.NetNS {
			return ledger.NetNS{Path: filepath.Join(dir, "netns", "cni-1"), Dev: other.Dev, Ino: other.Ino}
		}},
		{name: "plain file, an older READY sandbox visible", setup: func(t *testing.T, v *visFixture, dir string) ledger.NetNS {
			v.alloc("old-ready", bindNS(t, dir, "old"), cri.StateReady)
			return plainFile(t, v, dir)
		}},
		{name: "plain file, a newer READY sandbox visible", setup: plainFile, witness: true, gone: true},
		{name: "path missing, a newer READY sandbox visible", setup: missingPath, witness: true, gone: true},
		{name: "plain file, another boot", setup: plainFile, reboot: true, gone: true},
		{name: "path missing, the runtime's mount namespace", setup: missingPath, mounts: true, gone: true},
		{name: "directory missing, another boot", setup: func(t *testing.T, v *visFixture, dir string) ledger.NetNS {
			return ledger.NetNS{Path: filepath.Join(dir, "netns", "cni-1"), Dev: other.Dev, Ino: other.Ino}
		}, reboot: true, gone: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := newVisFixture(t, func() (bool, string) { return c.mounts, "same mounts" })
			dir := t.TempDir()
			judged := v.alloc("judged", c.setup(t, v, dir), cri.StateNotReady)
			if c.witness {
				v.alloc("new-ready", bindNS(t, dir, "new"), cri.StateReady)
			}
			if c.reboot {
				v.boot.Reboot("boot-2", time.Minute)
			}
			v.clk.Advance(time.Hour)
			v.rounds(1) // the guard's witnesses are the last round's READY sandboxes
			if got := len(v.r.Supersedable(v.ctx, []ledger.Lease{judged})); got != 0 == !c.gone {
				t.Fatalf("supersedable: %d, want gone=%v", got, c.gone)
			}
			if got := v.r.MayRelease(v.ctx, judged); got != c.gone {
				t.Fatalf("MayRelease = %v, want %v", got, c.gone)
			}
			v.rounds(6)
			if v.held("judged") == c.gone {
				t.Fatalf("held %v after the rounds, want gone=%v", v.held("judged"), c.gone)
			}
			if !c.gone {
				view := v.r.Verdict(key("judged"))
				if view.Class != ClassDoubt || !strings.Contains(view.Suspect, "not visible") || !strings.Contains(view.Suspect, "mountPropagation: HostToContainer") {
					t.Fatalf("view %+v, want a doubt naming the mount", view)
				}
			}
		})
	}
}

// plainFile: the judged lease recorded a namespace at dir/cni-1; the agent sees
// the mount point, a plain file of dir's filesystem.
func plainFile(t *testing.T, v *visFixture, dir string) ledger.NetNS {
	ns := bindNS(t, dir, "cni-1")
	if err := unix.Unmount(ns.Path, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	return ns
}

// missingPath: the judged lease recorded dir/cni-1, which the agent does not see.
func missingPath(t *testing.T, v *visFixture, dir string) ledger.NetNS {
	ns := plainFile(t, v, dir)
	if err := os.Remove(ns.Path); err != nil {
		t.Fatal(err)
	}
	return ns
}

// TestProcPIDGone: a /proc/PID/ns/net path (cri-dockerd's) whose process has
// exited is gone when the agent sees the host's PID namespace, and not visible
// otherwise; a live one is probed as usual.
func TestProcPIDGone(t *testing.T) {
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	path := fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid)
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	ns := ledger.NetNS{Path: path, Dev: st.Dev, Ino: st.Ino}
	host := NSFS{HostPID: func() bool { return true }}
	notHost := NSFS{HostPID: func() bool { return false }}
	if got, info := host.Probe(ns, pfx("10.99.5.1/24")); got != NSAddrAbsent {
		t.Fatalf("live process: %s %s", got, info)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait() // reaped: /proc/PID is gone
	if got, info := host.Probe(ns, pfx("10.99.5.1/24")); got != NSGone || !strings.Contains(info, "process") {
		t.Fatalf("exited process, host PID namespace: %s %s; want gone", got, info)
	}
	if got, info := notHost.Probe(ns, pfx("10.99.5.1/24")); got != NSNotVisible || !strings.Contains(info, "hostPID") {
		t.Fatalf("exited process, another PID namespace: %s %s; want not visible", got, info)
	}
	// the real check agrees with the kernel's initial PID namespace inode
	var pid unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &pid); err != nil {
		t.Fatal(err)
	}
	if hostPID() != (pid.Ino == 0xEFFFFFFC) {
		t.Fatalf("hostPID() = %v with /proc/self/ns/pid inode %d", hostPID(), pid.Ino)
	}
}
