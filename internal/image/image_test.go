package image_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/ipledger/ipledger/internal/image"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/containerdenv"
)

func spec() image.Spec {
	return image.Spec{
		Tag:        "ipledger:dev",
		Dirs:       []string{"tmp", "etc"},
		Files:      []image.File{{Path: "/usr/local/bin/b", Mode: 0o755, Data: []byte("bee")}, {Path: "usr/local/bin/a", Mode: 0o755, Data: []byte("ay")}, {Path: "bin", Link: "usr/local/bin"}},
		Entrypoint: []string{"/usr/local/bin/a"},
	}
}

func archive(t *testing.T, s image.Spec) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := image.Write(s, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestWriteIsReproducible(t *testing.T) {
	a, b := archive(t, spec()), archive(t, spec())
	if !bytes.Equal(a, b) {
		t.Fatalf("two builds of the same spec differ (%d and %d bytes)", len(a), len(b))
	}
	// Files given in another order: the same image.
	s := spec()
	s.Files[0], s.Files[1] = s.Files[1], s.Files[0]
	if !bytes.Equal(a, archive(t, s)) {
		t.Fatal("the order of Files changed the archive")
	}
	s.Files[0].Data = []byte("changed")
	if bytes.Equal(a, archive(t, s)) {
		t.Fatal("changed content gave the same archive")
	}
}

func TestArchiveHoldsFilesAtEpoch(t *testing.T) {
	p := filepath.Join(t.TempDir(), "img.tar")
	if err := image.WriteFile(spec(), p); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("ipledger:dev")
	img, err := tarball.ImageFromPath(p, &tag)
	if err != nil {
		t.Fatalf("the archive does not load as ipledger:dev: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !cf.Created.Time.Equal(image.Epoch) || cf.OS != "linux" || len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/usr/local/bin/a" {
		t.Fatalf("config: created %v os %q entrypoint %q", cf.Created, cf.OS, cf.Config.Entrypoint)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(image.Epoch) || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: mtime %v uid %d gid %d, want epoch and root", h.Name, h.ModTime, h.Uid, h.Gid)
		}
		data, _ := io.ReadAll(tr)
		got[h.Name] = string(data)
		if h.Typeflag == tar.TypeSymlink {
			got[h.Name] = "-> " + h.Linkname
		}
		if h.Name == "tmp/" && h.Mode != 0o1777 {
			t.Errorf("tmp mode %o, want 1777", h.Mode)
		}
	}
	for p, want := range map[string]string{"usr/": "", "usr/local/bin/": "", "usr/local/bin/a": "ay", "usr/local/bin/b": "bee", "etc/": "", "bin": "-> usr/local/bin"} {
		if v, ok := got[p]; !ok || v != want {
			t.Errorf("layer entry %q = %q (present %v), want %q", p, v, ok, want)
		}
	}
}

func TestBadSpecNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*image.Spec)
		want string
	}{
		{"bad tag", func(s *image.Spec) { s.Tag = "UPPER:case:x" }, "tag"},
		{"root file", func(s *image.Spec) { s.Files[0].Path = "/" }, "file path"},
		{"duplicate", func(s *image.Spec) { s.Files[1].Path = s.Files[0].Path }, "given twice"},
		{"file over dir", func(s *image.Spec) { s.Files[0].Path = "etc" }, "both a file and a directory"},
		{"link with data", func(s *image.Spec) { s.Files[0].Link = "x" }, "is a link"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec()
			tc.mut(&s)
			err := image.Write(s, io.Discard)
			if !errors.Is(err, image.ErrBadSpec) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrBadSpec naming %q", err, tc.want)
			}
		})
	}
}

// TestIpledgerSpec: the ipledger image's spec, from freshly built binaries, has the
// /var/run -> /run link the pods' namespace paths need, and without the binaries
// it asks for make build.
func TestIpledgerSpec(t *testing.T) {
	s, err := image.IpledgerSpec(agentenv.Bin(t), "ipledger:dev")
	if err != nil {
		t.Fatal(err)
	}
	varRun := false // the pods' namespaces are recorded as /var/run/netns/...
	for _, f := range s.Files {
		varRun = varRun || (f.Path == "var/run" && f.Link == "../run")
	}
	if !varRun {
		t.Error("the ipledger image has no /var/run -> /run link")
	}
	if _, err := image.IpledgerSpec(t.TempDir(), "ipledger:dev"); err == nil || !strings.Contains(err.Error(), "make build") {
		t.Fatalf("missing binaries: err = %v, want a hint to run make build", err)
	}
}

// TestIpledgerImageImportsIntoContainerd builds the ipledger image from freshly built
// binaries twice (byte-identical), imports it into a real containerd with
// ctr, and checks the runtime lists it under the reference kubelet uses. Its
// containerd comes first: under -short (containerdenv skips it) it builds nothing
// (two builds of the 150 MB image cost most of a minute under load).
func TestIpledgerImageImportsIntoContainerd(t *testing.T) {
	env := containerdenv.Start(t, containerdenv.Options{})
	bin := agentenv.Bin(t)
	dir := t.TempDir()
	s, err := image.IpledgerSpec(bin, "ipledger:dev")
	if err != nil {
		t.Fatal(err)
	}
	p1, p2 := filepath.Join(dir, "1.tar"), filepath.Join(dir, "2.tar")
	for _, p := range []string{p1, p2} {
		if err := image.WriteFile(s, p); err != nil {
			t.Fatal(err)
		}
	}
	b1, _ := os.ReadFile(p1)
	b2, _ := os.ReadFile(p2)
	if !bytes.Equal(b1, b2) {
		t.Fatal("two builds of the ipledger image differ")
	}
	sock := strings.TrimPrefix(env.Endpoint(), "unix://")
	if out, err := exec.Command("ctr", "--address", sock, "-n", "k8s.io", "images", "import", p1).CombinedOutput(); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
	out, err := exec.Command("ctr", "--address", sock, "-n", "k8s.io", "images", "ls", "-q").CombinedOutput()
	if err != nil {
		t.Fatalf("ctr images ls: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "docker.io/library/ipledger:dev") {
		t.Fatalf("imported image not listed as docker.io/library/ipledger:dev:\n%s", out)
	}
	// The binaries are in the unpacked image: mount it read-only and compare.
	mnt := t.TempDir()
	if out, err := exec.Command("ctr", "--address", sock, "-n", "k8s.io", "images", "mount", "docker.io/library/ipledger:dev", mnt).CombinedOutput(); err != nil {
		t.Fatalf("ctr images mount: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ctr", "--address", sock, "-n", "k8s.io", "images", "unmount", mnt).CombinedOutput(); err != nil {
			t.Logf("ctr images unmount: %v\n%s", err, out)
		}
	})
	for _, b := range image.Binaries {
		want, _ := os.ReadFile(filepath.Join(bin, b))
		got, err := os.ReadFile(filepath.Join(mnt, image.BinDir, b))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s in the image: %v (equal %v)", b, err, bytes.Equal(got, want))
		}
	}
	// The image's portmap is a working CNI plugin: it answers VERSION.
	cmd := exec.Command(filepath.Join(mnt, image.BinDir, "portmap"))
	cmd.Env = []string{"CNI_COMMAND=VERSION"}
	cmd.Stdin = strings.NewReader(`{"cniVersion":"1.0.0"}`)
	if out, err := cmd.Output(); err != nil || !strings.Contains(string(out), `"supportedVersions"`) {
		t.Errorf("portmap VERSION from the image: %v %s", err, out)
	}
}
