// Package e2eenv runs Kubernetes' own end-to-end suite (e2e.test, built by
// kubeenv from the pinned release) against a cluster of kubeenv nodes, with
// the images its network tests use built here from source and Debian's
// packages: there is no registry.
package e2eenv

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/image"
	"github.com/ipledger/ipledger/internal/testenv/debpkg"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// The references the suite of kubeenv.Version asks for (its
// test/utils/image/manifest.go; `e2e.test --list-images` prints them).
var (
	AgnhostRef = "registry.k8s.io/e2e-test-images/agnhost:" + kubeenv.Current.Images.Agnhost
	BusyboxRef = "registry.k8s.io/e2e-test-images/busybox:" + kubeenv.Current.Images.Busybox
	PauseRef   = "registry.k8s.io/pause:" + kubeenv.Current.Images.Pause
	// GlibcDNSRef is the DNS tests' second prober ("jessie"): glibc's
	// resolver through dig and getent, under sh -c.
	GlibcDNSRef = "registry.k8s.io/e2e-test-images/glibc-dns-testing:" + kubeenv.Current.Images.GlibcDNS
	// Regression74839Ref is the Conntrack test's server that sends an
	// out-of-window packet (its one binary, built from the release).
	Regression74839Ref = "registry.k8s.io/e2e-test-images/regression-issue-74839:" + kubeenv.Current.Images.Regression74839
	// DistrolessIptablesRef is the KubeProxy CLOSE_WAIT test's privileged
	// host-network pod: it sleeps, and the test reads the node's conntrack
	// table through sh, test, cat and grep in it.
	DistrolessIptablesRef = "registry.k8s.io/build-image/distroless-iptables:" + kubeenv.Current.Images.DistrolessIptables
)

// agnhostTools are what the suite execs inside agnhost (its Dockerfile adds
// bind-tools, curl, netcat-openbsd, iproute2, bash): host path, path in the
// image. The shell is dash, not busybox's: busybox sh runs its own nc applet
// (no -u) before any nc on PATH. wget is GNU wget: Debian's static busybox
// wget segfaults (the suite's Services tests fetch with wget -q -O - -T 1).
var agnhostTools = [][2]string{
	{"/usr/bin/dash", "usr/bin/dash"},
	{"/usr/bin/bash", "usr/bin/bash"},
	{"/usr/bin/curl", "usr/bin/curl"},
	{"/usr/bin/nc.openbsd", "usr/bin/nc"},
	{"/usr/sbin/ip", "usr/sbin/ip"},
	{"/usr/bin/dig", "usr/bin/dig"},
	{"/usr/bin/nslookup", "usr/bin/nslookup"},
	{"/usr/bin/wget", "usr/bin/wget"},
	{"/usr/bin/getent", "usr/bin/getent"},
}

// mergedUsr are the top-level links of a merged-/usr system, as Debian has
// them: the tools' libraries and the ELF interpreter are found through them.
var mergedUsr = []image.File{
	{Path: "bin", Link: "usr/bin"}, {Path: "sbin", Link: "usr/sbin"},
	{Path: "lib", Link: "usr/lib"}, {Path: "lib64", Link: "usr/lib64"},
}

var etcFiles = []image.File{
	{Path: "etc/passwd", Data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")},
	{Path: "etc/group", Data: []byte("root:x:0:\nnogroup:x:65534:\n")},
	{Path: "etc/nsswitch.conf", Data: []byte("passwd: files\ngroup: files\nhosts: files dns\n")},
}

// Images writes into dir the docker archives of the images the network
// tests use, under the references the suite asks for: agnhost (built from
// the release's source, with CoreDNS, the tools above and their shared
// libraries),
// glibc-dns-testing and distroless-iptables (agnhost's tree), busybox
// (Debian's busybox-static),
// pause (agnhost's pause) and regression-issue-74839 (built from the release). It installs
// the Debian packages it takes tools from.
func Images(tb testing.TB, dir string) []string {
	tb.Helper()
	debpkg.Need(tb, debpkg.BusyBox, debpkg.Curl, debpkg.Netcat, debpkg.Dash, debpkg.Bash, debpkg.IPRoute2, debpkg.DNSUtil, debpkg.Wget)
	agnhost, err := os.ReadFile(kubeenv.Agnhost(tb))
	if err != nil {
		tb.Fatal(err)
	}
	box, err := os.ReadFile("/bin/busybox")
	if err != nil {
		tb.Fatal(err)
	}
	applets, err := busyboxApplets()
	if err != nil {
		tb.Fatal(err)
	}
	// agnhost's image carries CoreDNS too: the DNS tests run /coredns in it
	// as a pod's own nameserver.
	coredns, err := os.ReadFile(CoreDNS(tb))
	if err != nil {
		tb.Fatal(err)
	}
	fs := newTree()
	fs.add(image.File{Path: "agnhost", Mode: 0o755, Data: agnhost})
	// porter's TLS ports serve the release's test certificate from the
	// working directory, as upstream's image adds it.
	for _, f := range []string{"localhost.crt", "localhost.key"} {
		data, err := os.ReadFile(filepath.Join(kubeenv.SourceDir(tb), "test", "images", "agnhost", "porter", f))
		if err != nil {
			tb.Fatal(err)
		}
		fs.add(image.File{Path: f, Mode: 0o644, Data: data})
	}
	fs.add(image.File{Path: "coredns", Mode: 0o755, Data: coredns})
	fs.add(image.File{Path: "usr/bin/busybox", Mode: 0o755, Data: box})
	for _, t := range agnhostTools {
		if err := fs.addELF(t[0], t[1]); err != nil {
			tb.Fatal(err)
		}
	}
	fs.add(image.File{Path: "usr/bin/sh", Link: "dash"})
	fs.addApplets(applets)
	// Entrypoint and Cmd as upstream's: a container given no args pauses
	// (the HostPort test's exec pod is one).
	agn := image.Spec{Tag: AgnhostRef, Files: fs.files(), Dirs: []string{"tmp", "proc", "sys", "dev", "root"},
		Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}, Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}

	bfs := newTree()
	bfs.add(image.File{Path: "usr/bin/busybox", Mode: 0o755, Data: box})
	bfs.add(image.File{Path: "usr/bin/sh", Link: "busybox"})
	bfs.addApplets(applets)
	bb := image.Spec{Tag: BusyboxRef, Files: bfs.files(), Dirs: []string{"tmp", "proc", "sys", "dev", "root"},
		Cmd: []string{"sh"}, Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}}

	pause := image.Spec{Tag: PauseRef, Files: []image.File{{Path: "pause", Mode: 0o755, Data: agnhost}},
		Entrypoint: []string{"/pause", "pause"}}

	// The glibc DNS prober: the same tree (dash, dig, getent, glibc), no
	// entrypoint; the layer is agnhost's, so each node stores it once.
	glibc := agn
	glibc.Tag, glibc.Entrypoint, glibc.Cmd = GlibcDNSRef, nil, nil
	// distroless-iptables: the same tree again, no entrypoint (the pod's
	// command is sleep; the test's reads are shell tools the tree has).
	iptables := glibc
	iptables.Tag = DistrolessIptablesRef

	boomBin, err := os.ReadFile(kubeenv.TestImageBinary(tb, "regression-issue-74839"))
	if err != nil {
		tb.Fatal(err)
	}
	boom := image.Spec{Tag: Regression74839Ref, Files: []image.File{{Path: "regression-issue-74839", Mode: 0o755, Data: boomBin}},
		Entrypoint: []string{"/regression-issue-74839"}}

	var out []string
	for _, s := range []image.Spec{agn, glibc, iptables, bb, pause, boom} {
		p := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(s.Tag)+".tar")
		if err := image.WriteFile(s, p); err != nil {
			tb.Fatalf("e2eenv: image %s: %v", s.Tag, err)
		}
		out = append(out, p)
	}
	return out
}

// tree is an image's files by path, with the merged-/usr links and /etc.
type tree map[string]image.File

func newTree() tree {
	t := tree{}
	for _, f := range append(append([]image.File(nil), mergedUsr...), etcFiles...) {
		t.add(f)
	}
	return t
}

func (t tree) add(f image.File) { t[strings.Trim(path.Clean("/"+f.Path), "/")] = f }

func (t tree) files() []image.File {
	var fs []image.File
	for _, k := range slices.Sorted(maps.Keys(t)) {
		fs = append(fs, t[k])
	}
	return fs
}

// addApplets links every busybox applet the tree has no file for to busybox,
// under usr/bin or usr/sbin.
func (t tree) addApplets(applets []string) {
	for _, a := range applets {
		dir := "usr/bin"
		if strings.HasPrefix(a, "sbin/") || strings.HasPrefix(a, "usr/sbin/") {
			dir = "usr/sbin"
		}
		p := dir + "/" + path.Base(a)
		if _, ok := t[p]; ok {
			continue
		}
		rel := "busybox"
		if dir == "usr/sbin" {
			rel = "../bin/busybox"
		}
		t.add(image.File{Path: p, Link: rel})
	}
}

// addELF adds the dynamically linked binary host at p in the image, with the
// shared libraries ldd finds for it at their real paths (and their sonames
// as links).
func (t tree) addELF(host, p string) error {
	data, err := os.ReadFile(host)
	if err != nil {
		return err
	}
	t.add(image.File{Path: p, Mode: 0o755, Data: data})
	libs, err := sharedLibs(host)
	if err != nil {
		return err
	}
	for _, l := range libs {
		if err := t.addLib(l); err != nil {
			return err
		}
	}
	return nil
}

// addLib adds the host file l at its real path, each symlink on the way as a
// link.
func (t tree) addLib(l string) error {
	for i := 0; i < 8; i++ {
		dir, err := filepath.EvalSymlinks(filepath.Dir(l))
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.Base(l))
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			t.add(image.File{Path: p, Mode: 0o755, Data: data})
			return nil
		}
		target, err := os.Readlink(p)
		if err != nil {
			return err
		}
		t.add(image.File{Path: p, Link: target})
		if !filepath.IsAbs(target) {
			target = filepath.Join(dir, target)
		}
		l = target
	}
	return fmt.Errorf("e2eenv: %s: too many links", l)
}

// sharedLibs is what `ldd bin` resolves, the ELF interpreter included.
func sharedLibs(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("e2eenv: ldd %s: %v", bin, err)
	}
	var libs []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			libs = append(libs, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, f[0])
		}
	}
	if len(libs) == 0 {
		return nil, fmt.Errorf("e2eenv: ldd %s found no libraries:\n%s", bin, out)
	}
	return libs, nil
}

// busyboxApplets is `busybox --list-full`: applet paths like bin/cat.
func busyboxApplets() ([]string, error) {
	out, err := exec.Command("/bin/busybox", "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("e2eenv: busybox --list-full: %v", err)
	}
	return strings.Fields(string(bytes.TrimSpace(out))), nil
}
