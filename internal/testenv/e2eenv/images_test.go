package e2eenv_test

import (
	"archive/tar"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/ipledger/ipledger/internal/testenv/e2eenv"
)

// TestAgnhostToolsRun unpacks the agnhost image built for the suite and runs,
// chrooted into it, what the network tests exec there: the shell must be
// dash (busybox's would run its own nc), and curl, nc -u, wget, dig, getent,
// ip and the busybox applets must find their libraries.
func TestAgnhostToolsRun(t *testing.T) {
	dir := t.TempDir()
	tars := e2eenv.Images(t, dir)
	root := filepath.Join(dir, "root")
	unpack(t, tars[0], e2eenv.AgnhostRef, root)
	for _, c := range []string{
		`readlink /usr/bin/sh`,
		`curl --version | head -1`,
		`nc -h 2>&1 | head -1; echo x | nc -u -w 1 127.0.0.1 9; echo nc-u-ok`,
		`wget --version | head -1`,
		`dig -v 2>&1`,
		`getent hosts localhost || echo getent-ran`,
		`ip -V`,
		`seq 1 2 | tail -1; hostname >/dev/null && echo applets-ok`,
		`/agnhost --help | head -1`,
		`/coredns -version | head -1`,
		`test -s /localhost.crt && test -s /localhost.key && echo porter-cert-ok`,
	} {
		out, err := exec.Command("chroot", root, "/usr/bin/sh", "-c", c).CombinedOutput()
		t.Logf("%s: %s", c, strings.TrimSpace(string(out)))
		if err != nil || strings.Contains(string(out), "not found") || strings.Contains(string(out), "error while loading") {
			t.Errorf("%q in the agnhost image: %v\n%s", c, err, out)
		}
	}
	if out, _ := exec.Command("chroot", root, "/usr/bin/sh", "-c", "readlink /usr/bin/sh").CombinedOutput(); strings.TrimSpace(string(out)) != "dash" {
		t.Errorf("/bin/sh is %q, want dash", out)
	}
}

// unpack extracts the single layer of the image ref in archive into dir.
func unpack(t *testing.T, archive, ref, dir string) {
	t.Helper()
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(archive, &tag)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d: %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, os.FileMode(h.Mode))
		case tar.TypeSymlink:
			os.MkdirAll(filepath.Dir(p), 0o755)
			err = os.Symlink(h.Linkname, p)
		case tar.TypeReg:
			os.MkdirAll(filepath.Dir(p), 0o755)
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY, os.FileMode(h.Mode)); err == nil {
				_, err = io.Copy(f, tr)
				f.Close()
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
