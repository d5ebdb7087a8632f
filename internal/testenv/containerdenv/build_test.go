package containerdenv_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/testenv"
	"github.com/ipledger/ipledger/internal/testenv/containerdenv"
)

// TestBuildSelected: the selected containerd is built from its module (or is
// Debian's) and reports its version.
func TestBuildSelected(t *testing.T) {
	testenv.SkipIfShort(t, "needs a containerd build")
	v, err := containerdenv.Selected()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := containerdenv.Binaries(v, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(dir, "containerd"), "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("containerd --version: %v: %s", err, out)
	}
	want := v
	if v == containerdenv.Debian {
		want = "1.6."
	}
	if !strings.Contains(string(out), want) {
		t.Fatalf("containerd --version = %q, want %s", out, want)
	}
	t.Logf("%s", out)
}

// TestConfigReadBySelected: the config rendered for the selected containerd is
// read by it as meant (containerd config dump: the merged configuration it
// would run with): the pause image, the CNI dirs, netns mounts under the state
// dir, the restricted oom_score_adj and the metrics address where this version
// keeps them.
func TestConfigReadBySelected(t *testing.T) {
	testenv.SkipIfShort(t, "needs a containerd build")
	v, err := containerdenv.Selected()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := containerdenv.Binaries(v, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	major := containerdenv.Major(v)
	d := t.TempDir()
	c := containerdenv.Config{
		Root: filepath.Join(d, "root"), State: filepath.Join(d, "state"), Socket: filepath.Join(d, "c.sock"),
		Sandbox: "ipledger.local/pause:test", Snapshotter: "native", RuncRoot: filepath.Join(d, "runc"),
		CNIBinDir: "/usr/lib/cni", CNIConfDir: filepath.Join(d, "net.d"), NetnsUnderState: true,
		MetricsAddress: "127.0.0.1:13380",
	}
	cfg := filepath.Join(d, "config.toml")
	if err := os.WriteFile(cfg, []byte(c.Render(major)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(dir, "containerd"), "--config", cfg, "config", "dump").CombinedOutput()
	if err != nil {
		t.Fatalf("containerd %s config dump: %v\n%s\nconfig:\n%s", v, err, out, c.Render(major))
	}
	for _, want := range []string{
		"ipledger.local/pause:test", c.CNIConfDir, c.RuncRoot,
		"netns_mounts_under_state_dir = true", "restrict_oom_score_adj = true", "max_conf_num = 1",
		"127.0.0.1:13380",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("containerd %s did not take %q from its config:\n%s", v, want, out)
		}
	}
}
