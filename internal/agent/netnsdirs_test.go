package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/reconcile"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// TestDoctorNetnsPropagation: doctor runs the reconciler's canary on a directory
// it can see. A READY sandbox's namespace there that is a bare mount point (the
// directory mounted without propagation: the agent sees the file, not the nsfs
// mount) makes doctor warn, naming the directory and the mount that fixes it; when
// every READY sandbox's namespace resolves to its recorded identity it says
// nothing.
func TestDoctorNetnsPropagation(t *testing.T) {
	dir := t.TempDir()
	ns := netenv.Namespace(t, "ipldoc")
	path := filepath.Join(dir, "cni-1")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(ns.Path, path, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(path, unix.MNT_DETACH) })
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	v := &fixedVerdicts{views: map[string]reconcile.View{"c0": {Sandbox: reconcile.SandboxReady}}}
	s, _ := podServer(t, agent.Config{Runtime: &setRuntime{}, Verdicts: v})
	r := addReq(t, "c0")
	r.NetNS = api.NetNS{Path: path, Dev: st.Dev, Ino: st.Ino}
	if resp := s.Handle(context.Background(), r); resp.Error != nil {
		t.Fatal(resp.Error)
	}
	warns := func() []string {
		d := s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpDoctor}).Doctor
		var out []string
		for _, c := range d.NetworkChecks {
			if c.Level == api.CheckWarn {
				out = append(out, c.Text)
			}
		}
		return out
	}
	if w := warns(); len(w) != 0 {
		t.Fatalf("doctor warns while the namespace resolves: %q", w)
	}
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil { // the bare mount point
		t.Fatal(err)
	}
	if w := warns(); len(w) != 1 || !strings.Contains(w[0], dir) || !strings.Contains(w[0], "mountPropagation: HostToContainer") {
		t.Fatalf("doctor warnings %q, want one naming %s and the mount", w, dir)
	}
}
