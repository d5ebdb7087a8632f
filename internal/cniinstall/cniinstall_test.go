package cniinstall_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ipledger/ipledger/internal/cniinstall"
)

const goodConf = `{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"ipledger-veth","ipam":{"type":"ipledger","ranges":[[{"subnet":"10.244.0.0/24"}]]}}]}`

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
	for _, p := range []string{"ipledger", "ipledger-veth"} {
		if err := os.WriteFile(filepath.Join(f.src, p), []byte("binary "+p), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	cf := filepath.Join(d, "conflist")
	if err := os.WriteFile(cf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	f.o = cniinstall.Options{SrcDir: f.src, Plugins: []string{"ipledger", "ipledger-veth"}, BinDir: f.bin, Conflist: cf, ConfDir: f.confd, ConfName: "10-ipledger.conflist"}
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
	want := []string{filepath.Join(f.bin, "ipledger"), filepath.Join(f.bin, "ipledger-veth"), filepath.Join(f.confd, "10-ipledger.conflist")}
	if strings.Join(done.Files, " ") != strings.Join(want, " ") {
		t.Fatalf("installed %q, want %q (conflist last)", done.Files, want)
	}
	for _, c := range []struct {
		path, data string
		mode       os.FileMode
	}{
		{want[0], "binary ipledger", 0o755}, {want[1], "binary ipledger-veth", 0o755}, {want[2], goodConf, 0o644},
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
	wg.Add(1)
	go func() {
		defer wg.Done()
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
	}()
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
