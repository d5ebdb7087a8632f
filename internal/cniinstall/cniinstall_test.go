package cniinstall_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ipledger/ipledger/internal/cniinstall"
)

const goodConf = `{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"ipledger-veth","ipam":{"type":"ipledger","ranges":[[{"subnet":"10.244.0.0/24"}]]}},{"type":"portmap","capabilities":{"portMappings":true},"snat":true}]}`

type fixture struct {
	o               cniinstall.Options
	src, bin, confd string
}

func newFixture(t *testing.T, conf string) fixture {
	t.Helper()
	d := t.TempDir()
	f := fixture{src: filepath.Join(d, "src"), bin: filepath.Join(d, "bin"), confd: filepath.Join(d, "net.d")}
	for _, dir := range []string{f.src, f.bin, f.confd} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"ipledger", "ipledger-veth", "portmap"} {
		if err := os.WriteFile(filepath.Join(f.src, p), []byte("binary "+p), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	cf := filepath.Join(d, "conflist")
	if err := os.WriteFile(cf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	f.o = cniinstall.Options{SrcDir: f.src, Plugins: []string{"ipledger", "ipledger-veth"}, Shared: []string{"portmap"},
		BinDir: f.bin, Conflist: cf, ConfDir: f.confd, ConfName: "10-ipledger.conflist"}
	return f
}

func TestInstallCopiesPluginsThenConflist(t *testing.T) {
	f := newFixture(t, goodConf)
	// An older plugin is replaced, not appended to.
	if err := os.WriteFile(filepath.Join(f.bin, "ipledger"), []byte("an older and much longer binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	done, err := cniinstall.Install(f.o)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(f.bin, "ipledger"), filepath.Join(f.bin, "ipledger-veth"), filepath.Join(f.bin, "portmap"), filepath.Join(f.confd, "10-ipledger.conflist")}
	if strings.Join(done.Files, " ") != strings.Join(want, " ") {
		t.Fatalf("installed %q, want %q (conflist last)", done.Files, want)
	}
	for _, c := range []struct {
		path, data string
		mode       os.FileMode
	}{
		{want[0], "binary ipledger", 0o755}, {want[1], "binary ipledger-veth", 0o755}, {want[2], "binary portmap", 0o755}, {want[3], goodConf, 0o644},
		{done.Record, `{"plugins":["ipledger","ipledger-veth","portmap"]}` + "\n", 0o644},
	} {
		fi, err := os.Stat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(c.path)
		if string(b) != c.data || fi.Mode().Perm() != c.mode {
			t.Errorf("%s: %q mode %v, want %q mode %v", c.path, b, fi.Mode().Perm(), c.data, c.mode)
		}
	}
	for _, dir := range []string{f.bin, f.confd} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".") {
				t.Errorf("temporary file left: %s/%s", dir, e.Name())
			}
		}
	}
}

func TestInstallRefusesBadInput(t *testing.T) {
	for _, c := range []struct {
		name, conf string
		mut        func(*cniinstall.Options)
		want       string
		bad        bool
	}{
		{"not json", `{"cniVersion":`, nil, "not JSON", true},
		{"no version", `{"name":"n","plugins":[{"type":"ipledger-veth"}]}`, nil, `"cniVersion" is missing`, true},
		{"no name", `{"cniVersion":"1.0.0","plugins":[{"type":"ipledger-veth"}]}`, nil, `"name" is missing`, true},
		{"no plugins", `{"cniVersion":"1.0.0","name":"n","plugins":[]}`, nil, `"plugins" is empty`, true},
		{"no type", `{"cniVersion":"1.0.0","name":"n","plugins":[{}]}`, nil, `plugins[0]: "type" is missing`, true},
		{"unknown plugin type", `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"nosuch"}]}`, nil, `plugin type "nosuch" is not in`, true},
		{"bad conf name", goodConf, func(o *cniinstall.Options) { o.ConfName = "../x.conflist" }, "conf name", false},
		{"missing plugin", goodConf, func(o *cniinstall.Options) { o.Plugins = append(o.Plugins, "absent") }, "absent", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, c.conf)
			if c.mut != nil {
				c.mut(&f.o)
			}
			_, err := cniinstall.Install(f.o)
			if err == nil || !strings.Contains(err.Error(), c.want) || errors.Is(err, cniinstall.ErrBadConflist) != c.bad {
				t.Fatalf("err = %v, want one naming %q (ErrBadConflist %v)", err, c.want, c.bad)
			}
			if _, err := os.Stat(filepath.Join(f.confd, "10-ipledger.conflist")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a refused install wrote the conflist (stat: %v)", err)
			}
		})
	}
}

// TestHostSymlinkCountsAsInstalled: a plugin the conflist names may be a
// symlink whose target only the host sees (the installer runs in a container).
func TestHostSymlinkCountsAsInstalled(t *testing.T) {
	f := newFixture(t, `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge","ipam":{"type":"host-local"}}]}`)
	for _, p := range []string{"bridge", "host-local"} {
		if err := os.Symlink("/nonexistent/in/this/container/"+p, filepath.Join(f.bin, p)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cniinstall.Install(f.o); err != nil {
		t.Fatalf("conflist naming host-side symlinked plugins refused: %v", err)
	}
}

// TestReaderNeverSeesHalfAFile: while installs alternate two versions of a
// large plugin, a concurrent reader only ever reads one whole version.
func TestReaderNeverSeesHalfAFile(t *testing.T) {
	f := newFixture(t, goodConf)
	a, b := bytes.Repeat([]byte("a"), 4<<20), bytes.Repeat([]byte("b"), 2<<20)
	src := filepath.Join(f.src, "ipledger")
	dst := filepath.Join(f.bin, "ipledger")
	if err := os.WriteFile(src, a, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := cniinstall.Install(f.o); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads, torn int
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			got, err := os.ReadFile(dst)
			if err != nil {
				torn++
				continue
			}
			reads++
			if !bytes.Equal(got, a) && !bytes.Equal(got, b) {
				torn++
			}
		}
	})
	for i := 0; i < 20; i++ {
		data := a
		if i%2 == 0 {
			data = b
		}
		if err := os.WriteFile(src, data, 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := cniinstall.Install(f.o); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d reads during 20 installs", reads)
	if torn > 0 || reads == 0 {
		t.Fatalf("%d of %d reads saw a missing or partial plugin", torn, reads)
	}
}

// exists reports whether p exists (a dangling symlink counts).
func exists(t *testing.T, p string) bool {
	t.Helper()
	_, err := os.Lstat(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSharedPluginOnlyWhereNoneIs: portmap (a shared plugin) is installed and
// recorded where the node has none, upgraded by the next install once it is
// recorded as ours, and left alone, unrecorded, where the operator put one (a
// file or a symlink into the host's own plugins); Uninstall removes it in the
// first case only.
func TestSharedPluginOnlyWhereNoneIs(t *testing.T) {
	for _, c := range []struct {
		name     string
		operator func(t *testing.T, dst string) // the node's portmap before the install, if any
		ours     bool
	}{
		{"absent", nil, true},
		{"operator-file", func(t *testing.T, dst string) {
			if err := os.WriteFile(dst, []byte("operator portmap"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"operator-symlink", func(t *testing.T, dst string) {
			if err := os.Symlink("/usr/lib/cni/portmap", dst); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, goodConf)
			dst := filepath.Join(f.bin, "portmap")
			var before string
			if c.operator != nil {
				c.operator(t, dst)
				before, _ = os.Readlink(dst)
				if before == "" {
					before = read(t, dst)
				}
			}
			for i, src := range []string{"binary portmap", "binary portmap, newer"} {
				if err := os.WriteFile(filepath.Join(f.src, "portmap"), []byte(src), 0o755); err != nil {
					t.Fatal(err)
				}
				done, err := cniinstall.Install(f.o)
				if err != nil {
					t.Fatalf("install %d: %v", i+1, err)
				}
				rec := read(t, done.Record)
				if c.ours {
					if got := read(t, dst); got != src || !slices.Contains(done.Files, dst) || !strings.Contains(rec, `"portmap"`) {
						t.Fatalf("install %d: portmap %q (want %q), files %q, record %s", i+1, got, src, done.Files, rec)
					}
					continue
				}
				now, _ := os.Readlink(dst)
				if now == "" {
					now = read(t, dst)
				}
				if now != before || slices.Contains(done.Files, dst) || !slices.Equal(done.Kept, []string{"portmap"}) || strings.Contains(rec, "portmap") {
					t.Fatalf("install %d: the operator's portmap is now %q (was %q), files %q, kept %q, record %s", i+1, now, before, done.Files, done.Kept, rec)
				}
			}
			if _, err := cniinstall.Uninstall(f.o); err != nil {
				t.Fatal(err)
			}
			if exists(t, dst) == c.ours {
				t.Fatalf("after uninstall portmap exists %v, want %v", exists(t, dst), !c.ours)
			}
		})
	}
}

// TestUninstall: Uninstall removes the conflist, ipledger's plugins and the
// record, and nothing else: other networks' plugins and conflists and the
// agent's ledger stay. A second Uninstall has nothing to do and succeeds.
func TestUninstall(t *testing.T) {
	f := newFixture(t, goodConf)
	others := []string{filepath.Join(f.bin, "bridge"), filepath.Join(f.bin, "host-local"), filepath.Join(f.confd, "20-other.conflist")}
	ledger := filepath.Join(filepath.Dir(f.bin), "var-lib-ipledger", "ledger.db")
	for _, p := range append(others, ledger) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("not ipledger's to remove"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	done, err := cniinstall.Install(f.o)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := cniinstall.Uninstall(f.o)
	if err != nil {
		t.Fatal(err)
	}
	conflist := filepath.Join(f.confd, "10-ipledger.conflist")
	want := []string{conflist, filepath.Join(f.bin, "ipledger"), filepath.Join(f.bin, "ipledger-veth"), filepath.Join(f.bin, "portmap"), done.Record}
	if !slices.Equal(gone.Removed, want) {
		t.Fatalf("removed %q, want %q (conflist first, record last)", gone.Removed, want)
	}
	for _, p := range want {
		if exists(t, p) {
			t.Errorf("%s still there", p)
		}
	}
	for _, p := range append(others, ledger) {
		if !exists(t, p) {
			t.Errorf("%s removed: not ipledger's", p)
		}
	}
	// run again, nothing is there: it says so, naming each file, and fails
	again, err := cniinstall.Uninstall(f.o)
	if !errors.Is(err, cniinstall.ErrNotFound) || len(again.Removed) != 0 {
		t.Fatalf("second uninstall: removed %q, %v; want nothing removed and ErrNotFound", again.Removed, err)
	}
	for _, p := range want[:3] {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("second uninstall's error %q does not name %s", err, p)
		}
	}
}

// TestUninstallWrongDirs: run where ipledger was not installed (on a node without
// the flags, the defaults being the DaemonSet's /host/... mounts), Uninstall removes
// nothing, runs the cleanups, and fails naming the conflist and plugins it did not
// find, the directory that does not exist, and the flags that fix it; the files in
// the real directories stay.
func TestUninstallWrongDirs(t *testing.T) {
	f := newFixture(t, goodConf)
	done, err := cniinstall.Install(f.o)
	if err != nil {
		t.Fatal(err)
	}
	wrong := f.o
	wrong.BinDir, wrong.ConfDir = filepath.Join(t.TempDir(), "host", "opt", "cni", "bin"), filepath.Join(t.TempDir(), "etc-cni-net.d")
	if err := os.MkdirAll(wrong.ConfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cleaned := false
	wrong.Cleanups = []cniinstall.Cleanup{func() error { cleaned = true; return nil }}
	gone, err := cniinstall.Uninstall(wrong)
	if !errors.Is(err, cniinstall.ErrNotFound) || len(gone.Removed) != 0 {
		t.Fatalf("uninstall in the wrong dirs: removed %q, %v; want ErrNotFound", gone.Removed, err)
	}
	for _, s := range []string{filepath.Join(wrong.ConfDir, "10-ipledger.conflist"), filepath.Join(wrong.BinDir, "ipledger"), filepath.Join(wrong.BinDir, "ipledger-veth"),
		"no directory " + wrong.BinDir, "--cni-bin-dir /opt/cni/bin --cni-conf-dir /etc/cni/net.d"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not name %q", err, s)
		}
	}
	if !cleaned {
		t.Error("the cleanups did not run")
	}
	for _, p := range done.Files {
		if !exists(t, p) {
			t.Errorf("%s removed by an uninstall of other dirs", p)
		}
	}
}

// TestUninstallCleanups: the hooks run after the conflist and the plugins are
// gone; a failing hook fails Uninstall after the others ran and keeps the record,
// so that a rerun removes what the record names and runs the hooks again.
func TestUninstallCleanups(t *testing.T) {
	f := newFixture(t, goodConf)
	done, err := cniinstall.Install(f.o)
	if err != nil {
		t.Fatal(err)
	}
	var calls []string
	filesGone := func(name string) cniinstall.Cleanup {
		return func() error {
			calls = append(calls, name)
			for _, p := range done.Files {
				if exists(t, p) {
					return fmt.Errorf("%s ran while %s was still there", name, p)
				}
			}
			return nil
		}
	}
	errRoutes := errors.New("routes: netlink busy")
	f.o.Cleanups = []cniinstall.Cleanup{func() error { calls = append(calls, "routes"); return errRoutes }, filesGone("netfilter")}
	if _, err := cniinstall.Uninstall(f.o); !errors.Is(err, errRoutes) {
		t.Fatalf("uninstall with a failing cleanup: %v, want %v", err, errRoutes)
	}
	if !slices.Equal(calls, []string{"routes", "netfilter"}) || !exists(t, done.Record) {
		t.Fatalf("cleanups called %q, record kept %v; want both called and the record kept", calls, exists(t, done.Record))
	}
	calls = nil
	f.o.Cleanups = []cniinstall.Cleanup{filesGone("routes"), filesGone("netfilter")}
	if _, err := cniinstall.Uninstall(f.o); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(calls, []string{"routes", "netfilter"}) || exists(t, done.Record) {
		t.Fatalf("rerun: cleanups called %q, record kept %v", calls, exists(t, done.Record))
	}
}

// TestUninstallWithoutRecord: with no record (installed by a release that wrote
// none) or an unreadable one, Uninstall removes the conflist and Options.Plugins
// and leaves the shared plugins: it cannot tell that they were ipledger's. An
// unreadable record is reported and kept; Install refuses to run over it.
func TestUninstallWithoutRecord(t *testing.T) {
	for _, c := range []struct {
		name   string
		record string // "" for none
	}{
		{"none", ""},
		{"unreadable", `{"plugins":`},
		{"bad name", `{"plugins":["../../etc/passwd"]}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, goodConf)
			done, err := cniinstall.Install(f.o)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(done.Record); err != nil {
				t.Fatal(err)
			}
			if c.record != "" {
				if err := os.WriteFile(done.Record, []byte(c.record), 0o644); err != nil {
					t.Fatal(err)
				}
				if _, err := cniinstall.Install(f.o); !errors.Is(err, cniinstall.ErrBadRecord) {
					t.Fatalf("install over a bad record: %v, want ErrBadRecord", err)
				}
			}
			_, err = cniinstall.Uninstall(f.o)
			if (c.record != "") != errors.Is(err, cniinstall.ErrBadRecord) || (c.record == "" && err != nil) {
				t.Fatalf("uninstall: %v", err)
			}
			for p, want := range map[string]bool{
				"10-ipledger.conflist": false, "ipledger": false, "ipledger-veth": false, "portmap": true,
			} {
				dir := f.bin
				if strings.HasSuffix(p, ".conflist") {
					dir = f.confd
				}
				if got := exists(t, filepath.Join(dir, p)); got != want {
					t.Errorf("%s exists %v, want %v", p, got, want)
				}
			}
			if exists(t, done.Record) != (c.record != "") {
				t.Errorf("record exists %v, want %v", exists(t, done.Record), c.record != "")
			}
		})
	}
}

// shippedConflist is the conflist of deploy/ipledger.yaml's ConfigMap (the block
// under "ipledger.conflist: |", indented four spaces).
func shippedConflist(t *testing.T) string {
	t.Helper()
	m := read(t, filepath.Join("..", "..", "deploy", "ipledger.yaml"))
	start := strings.Index(m, "  ipledger.conflist: |\n")
	if start < 0 {
		t.Fatal("deploy/ipledger.yaml has no ipledger.conflist key")
	}
	var b strings.Builder
	for _, l := range strings.Split(m[start:], "\n")[1:] {
		if !strings.HasPrefix(l, "    ") {
			break
		}
		b.WriteString(strings.TrimPrefix(l, "    ") + "\n")
	}
	return b.String()
}

// TestShippedConflist: the conflist deploy/ipledger.yaml ships installs, and
// chains portmap (hostPorts, with SNAT for hairpin traffic) after ipledger-veth,
// which has no mtu (it takes the node's).
func TestShippedConflist(t *testing.T) {
	conf := shippedConflist(t)
	f := newFixture(t, conf)
	if _, err := cniinstall.Install(f.o); err != nil {
		t.Fatalf("the shipped conflist does not install: %v\n%s", err, conf)
	}
	var c struct {
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(conf), &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Plugins) != 2 || c.Plugins[0]["type"] != "ipledger-veth" || c.Plugins[1]["type"] != "portmap" {
		t.Fatalf("plugins %v, want ipledger-veth then portmap", c.Plugins)
	}
	if _, ok := c.Plugins[0]["mtu"]; ok {
		t.Errorf("ipledger-veth sets mtu %v: the node's default-route MTU is the default", c.Plugins[0]["mtu"])
	}
	pm := c.Plugins[1]
	if caps, _ := pm["capabilities"].(map[string]any); caps["portMappings"] != true || pm["snat"] != true {
		t.Errorf("portmap %v, want capabilities.portMappings and snat true", pm)
	}
}

// versionPlugin writes a CNI plugin at path answering VERSION with versions.
func versionPlugin(t *testing.T, path string, versions ...string) {
	t.Helper()
	q := make([]string, len(versions))
	for i, v := range versions {
		q[i] = fmt.Sprintf("%q", v)
	}
	script := fmt.Sprintf("#!/bin/sh\n[ \"$CNI_COMMAND\" = VERSION ] || exit 1\necho '{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[%s]}'\n", strings.Join(q, ","))
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestChainPluginVersions: on containerd 2.3.7 (which loads 1.1.0) a node's own
// portmap kept in the chain decides too: one that speaks only up to 1.0.0
// (Debian 12's, CNI plugins 1.1.1), or that cannot be asked (a symlink this
// container cannot follow), makes the automatic choice 1.0.0, saying why;
// the operator's explicit 1.1.0 is refused naming the plugin; a portmap that
// speaks 1.1.0 leaves 1.1.0. Without this the runtime loads a 1.1.0 chain whose
// old portmap fails every STATUS ("missing containerID"): the Node never Ready.
func TestChainPluginVersions(t *testing.T) {
	rt := &cniinstall.RuntimeInfo{Name: "containerd", Version: "v2.3.7"}
	for _, c := range []struct {
		name     string
		portmap  func(t *testing.T, path string)
		choice   string
		want     string
		err      error
		wantWhat []string
	}{
		{"old portmap, auto", func(t *testing.T, p string) { versionPlugin(t, p, "0.3.1", "0.4.0", "1.0.0") }, "auto", "1.0.0", nil, []string{"portmap", "speaks 1.0.0 at most"}},
		{"new portmap, auto", func(t *testing.T, p string) { versionPlugin(t, p, "0.4.0", "1.0.0", "1.1.0") }, "auto", "1.1.0", nil, nil},
		{"unaskable portmap, auto", func(t *testing.T, p string) {
			if err := os.Symlink("/nonexistent/usr/lib/cni/portmap", p); err != nil {
				t.Fatal(err)
			}
		}, "auto", "1.0.0", nil, []string{"portmap", "could not be asked"}},
		{"old portmap, operator's 1.1.0", func(t *testing.T, p string) { versionPlugin(t, p, "0.4.0", "1.0.0") }, "1.1.0", "", cniinstall.ErrVersionRefused, []string{"portmap", "1.0.0 at most", "--cni-version 1.0.0"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, goodConf)
			c.portmap(t, filepath.Join(f.bin, "portmap"))
			f.o.Runtime, f.o.CNIVersion = rt, c.choice
			done, err := cniinstall.Install(f.o)
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("Install = %v, want %v", err, c.err)
				}
				for _, w := range c.wantWhat {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				CNIVersion string `json:"cniVersion"`
			}
			if err := json.Unmarshal([]byte(read(t, filepath.Join(f.confd, "10-ipledger.conflist"))), &got); err != nil {
				t.Fatal(err)
			}
			if done.CNIVersion != c.want || got.CNIVersion != c.want {
				t.Fatalf("cniVersion %q (conflist %q), want %s: %s", done.CNIVersion, got.CNIVersion, c.want, done.CNIVersionReason)
			}
			for _, w := range c.wantWhat {
				if !strings.Contains(done.CNIVersionReason, w) {
					t.Errorf("reason %q does not say %q", done.CNIVersionReason, w)
				}
			}
			t.Logf("cniVersion %s: %s", done.CNIVersion, done.CNIVersionReason)
		})
	}
}
