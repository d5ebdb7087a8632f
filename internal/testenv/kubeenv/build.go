// Package kubeenv runs a real one-node Kubernetes cluster for tests: etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler on loopback with
// certificates the test generates, and a kubelet against a private containerd
// (internal/testenv/containerdenv). The Kubernetes binaries are built from source
// at a pinned release (Version) by a small module generated in the cache
// directory, and cached there by version: a warm run builds nothing. Every
// process is started and stopped by PID, and what the kubelet changes on the
// host (sysctls, iptables chains, kubepods cgroups, mounts) is undone when the
// test ends.
package kubeenv

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv"
)

// Version is the Kubernetes release the cluster runs; StagingVersion is the
// matching version of its staging modules (k8s.io/api, client-go, ...).
const (
	Version        = "v1.36.3"
	StagingVersion = "v0.36.3"
	// EtcdModuleVersion is the etcd server Version's go.mod requires; its
	// main package builds the etcd binary.
	EtcdModuleVersion = "v3.6.8"
)

// stagingModules are the k8s.io modules that k8s.io/kubernetes keeps in its
// staging/ tree and replaces with local paths in its own go.mod; a module that
// requires k8s.io/kubernetes must replace each with its published version.
var stagingModules = []string{
	"api", "apiextensions-apiserver", "apimachinery", "apiserver", "cli-runtime",
	"client-go", "cloud-provider", "cluster-bootstrap", "code-generator",
	"component-base", "component-helpers", "controller-manager", "cri-api",
	"cri-client", "cri-streaming", "csi-translation-lib", "dynamic-resource-allocation",
	"endpointslice", "externaljwt", "kms", "kube-aggregator", "kube-controller-manager",
	"kube-proxy", "kube-scheduler", "kubectl", "kubelet", "metrics", "mount-utils",
	"pod-security-admission", "sample-apiserver", "sample-cli-plugin",
	"sample-controller", "streaming",
}

// Commands are the Kubernetes commands built (package k8s.io/kubernetes/cmd/NAME).
var Commands = []string{"kubelet", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"}

// CacheDir is where the binaries of Version are built and kept:
// $IPLEDGER_KUBE_CACHE/Version, default /var/cache/ipledger/kube/Version.
func CacheDir() string {
	base := os.Getenv("IPLEDGER_KUBE_CACHE")
	if base == "" {
		base = "/var/cache/ipledger/kube"
	}
	return filepath.Join(base, Version)
}

func goMod() string {
	var b strings.Builder
	fmt.Fprintf(&b, "module ipledger.test/kubebuild\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n", Version)
	for _, m := range stagingModules {
		fmt.Fprintf(&b, "\tk8s.io/%s => k8s.io/%s %s\n", m, m, StagingVersion)
	}
	b.WriteString(")\n")
	return b.String()
}

func ldflags() string {
	v := "k8s.io/component-base/version"
	minor := strings.Split(strings.TrimPrefix(Version, "v"), ".")[1]
	return fmt.Sprintf("-s -w -X %[1]s.gitVersion=%[2]s -X %[1]s.gitMajor=1 -X %[1]s.gitMinor=%[3]s -X %[1]s.gitTreeState=clean -X %[1]s.buildDate=1970-01-01T00:00:00Z", v, Version, minor)
}

// recipeKey identifies what a build produces: the module, flags, the Go
// toolchain. The cache is valid while bin/.stamp holds it.
func recipeKey() string {
	h := sha256.Sum256([]byte(goMod() + "\x00" + ldflags() + "\x00" + EtcdModuleVersion + "\x00" + runtime.Version() + "\x00" + strings.Join(Commands, ",")))
	return hex.EncodeToString(h[:])[:16]
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// Binaries returns the directory holding the Commands and etcd, building them
// first unless the cache already has them. Builds are serialized across
// processes with a lock file. Under -short it skips tb: Start and StartAPIServer
// call it first, so every test that needs Kubernetes is left out of the fast tier.
func Binaries(tb testing.TB) string {
	tb.Helper()
	testenv.SkipIfShort(tb, "needs a Kubernetes build")
	binOnce.Do(func() { binDir, binErr = ensureBinaries(tb) })
	if binErr != nil {
		tb.Fatal(binErr)
	}
	return binDir
}

func cached(bin string) bool {
	stamp, err := os.ReadFile(filepath.Join(bin, ".stamp"))
	if err != nil || strings.TrimSpace(string(stamp)) != recipeKey() {
		return false
	}
	for _, c := range append(append([]string(nil), Commands...), "etcd") {
		if fi, err := os.Stat(filepath.Join(bin, c)); err != nil || fi.Size() == 0 {
			return false
		}
	}
	return true
}

func ensureBinaries(tb testing.TB) (string, error) {
	dir := CacheDir()
	bin := filepath.Join(dir, "bin")
	if cached(bin) {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if cached(bin) {
		return bin, nil
	}
	t0 := time.Now()
	tb.Logf("kubeenv: building Kubernetes %s (kubelet, control plane, kubectl, etcd) into %s; cold this takes several minutes", Version, bin)
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte(goMod()), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "doc.go"), []byte("// Package kubebuild only pins the modules the Kubernetes commands are built from.\npackage kubebuild\n"), 0o644); err != nil {
		return "", err
	}
	tmp := filepath.Join(dir, "bin.tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	run := func(args ...string) error { return goIn(src, args...) }
	var pkgs []string
	for _, c := range Commands {
		pkgs = append(pkgs, "k8s.io/kubernetes/cmd/"+c+"@"+Version)
	}
	if err := run(append([]string{"get"}, append(pkgs, "go.etcd.io/etcd/server/v3@"+EtcdModuleVersion)...)...); err != nil {
		return "", err
	}
	for _, c := range Commands {
		t1 := time.Now()
		if err := run("build", "-trimpath", "-ldflags", ldflags(), "-o", filepath.Join(tmp, c), "k8s.io/kubernetes/cmd/"+c); err != nil {
			return "", err
		}
		tb.Logf("kubeenv: built %s in %v", c, time.Since(t1).Round(time.Second))
	}
	if err := run("build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(tmp, "etcd"), "go.etcd.io/etcd/server/v3"); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(tmp, ".stamp"), []byte(recipeKey()+"\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.RemoveAll(bin); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	tb.Logf("kubeenv: Kubernetes %s built in %v", Version, time.Since(t0).Round(time.Second))
	if !cached(bin) {
		return "", errors.New("kubeenv: build finished but the cache does not validate")
	}
	return bin, nil
}

// goIn runs the go command in the build module src, as every build of the
// cache does: no cgo, modules resolved by the module, the local toolchain.
func goIn(src string, args ...string) error {
	gobin := "go"
	if _, err := exec.LookPath("go"); err != nil {
		gobin = "/usr/local/go/bin/go"
	}
	cmd := exec.Command(gobin, args...)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod -buildvcs=false", "GOWORK=off", "GOTOOLCHAIN=local")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubeenv: go %s: %v\n%s", strings.Join(args, " "), err, tail(string(out), 40))
	}
	return nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// extraDir is where ExtraBinary keeps command name: a sibling of the main
// build's bin, with a stamp of its own, so adding an extra command never
// invalidates the Commands.
func extraDir(name string) string { return filepath.Join(CacheDir(), "extra", name) }

// extraKey is the recipe of an extra command: the main recipe and its name.
func extraKey(name string) string {
	h := sha256.Sum256([]byte(recipeKey() + "\x00" + name))
	return hex.EncodeToString(h[:])[:16]
}

func extraCached(bin, name string) bool {
	stamp, err := os.ReadFile(filepath.Join(bin, ".stamp"))
	if err != nil || strings.TrimSpace(string(stamp)) != extraKey(name) {
		return false
	}
	fi, err := os.Stat(filepath.Join(bin, name))
	return err == nil && fi.Size() > 0
}

var (
	extraMu   sync.Mutex
	extraBins = map[string]string{}
)

// ExtraBinary returns the path of the Kubernetes command name
// (k8s.io/kubernetes/cmd/NAME) outside Commands, built from the same module,
// flags and toolchain as Binaries into a directory of its own with its own
// stamp, under the same build lock; a warm run builds nothing. Under -short it
// skips tb, as Binaries does.
func ExtraBinary(tb testing.TB, name string) string {
	tb.Helper()
	pkg := "k8s.io/kubernetes/cmd/" + name
	return extra(tb, name, pkg+"@"+Version, func(src, out string) error {
		return goIn(src, "build", "-trimpath", "-ldflags", ldflags(), "-o", out, pkg)
	})
}

// E2ETest returns the path of e2e.test, Kubernetes' end-to-end suite
// (k8s.io/kubernetes/test/e2e compiled with go test -c), and of the ginkgo
// command of the version the suite requires, both built from the same module
// as Binaries and cached the same way.
func E2ETest(tb testing.TB) (e2eTest, ginkgo string) {
	tb.Helper()
	const pkg = "k8s.io/kubernetes/test/e2e"
	e2eTest = extra(tb, "e2e.test", "-t "+pkg+"@"+Version, func(src, out string) error {
		return goIn(src, "test", "-c", "-vet=off", "-trimpath", "-ldflags", ldflags(), "-o", out, pkg)
	})
	ginkgo = extra(tb, "ginkgo", "-t "+pkg+"@"+Version, func(src, out string) error {
		return goIn(src, "build", "-trimpath", "-ldflags", "-s -w", "-o", out, "github.com/onsi/ginkgo/v2/ginkgo")
	})
	return e2eTest, ginkgo
}

// TestImageBinary returns the path of the release's test image command name
// (k8s.io/kubernetes/test/images/NAME, e.g. regression-issue-74839), built
// and cached as ExtraBinary builds.
func TestImageBinary(tb testing.TB, name string) string {
	tb.Helper()
	pkg := "k8s.io/kubernetes/test/images/" + name
	return extra(tb, name, pkg+"@"+Version, func(src, out string) error {
		return goIn(src, "build", "-trimpath", "-ldflags", "-s -w", "-o", out, pkg)
	})
}

// Agnhost returns the path of agnhost, the e2e suite's all-purpose test
// server and client (k8s.io/kubernetes/test/images/agnhost, part of the same
// module), built and cached as ExtraBinary builds.
func Agnhost(tb testing.TB) string {
	tb.Helper()
	const pkg = "k8s.io/kubernetes/test/images/agnhost"
	return extra(tb, "agnhost", pkg+"@"+Version, func(src, out string) error {
		return goIn(src, "build", "-trimpath", "-ldflags", "-s -w", "-o", out, pkg)
	})
}

// extra builds (once per process, and once per recipe on the machine) the
// binary name: `go get get` (its arguments, space-separated) in a module of its
// own pinned as the main build is, then build(src, out) writing it to out.
// Under -short it skips tb.
func extra(tb testing.TB, name, get string, build func(src, out string) error) string {
	tb.Helper()
	testenv.SkipIfShort(tb, "needs a Kubernetes build")
	extraMu.Lock()
	defer extraMu.Unlock()
	if p, ok := extraBins[name]; ok {
		return p
	}
	p, err := ensureExtra(tb, name, get, build)
	if err != nil {
		tb.Fatal(err)
	}
	extraBins[name] = p
	return p
}

func ensureExtra(tb testing.TB, name, get string, build func(src, out string) error) (string, error) {
	dir := extraDir(name)
	bin := filepath.Join(dir, "bin")
	if extraCached(bin, name) {
		return filepath.Join(bin, name), nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(CacheDir(), ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if extraCached(bin, name) {
		return filepath.Join(bin, name), nil
	}
	t0 := time.Now()
	tb.Logf("kubeenv: building %s %s into %s", name, Version, bin)
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte(goMod()), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "doc.go"), []byte("// Package kubebuild only pins the modules the Kubernetes commands are built from.\npackage kubebuild\n"), 0o644); err != nil {
		return "", err
	}
	tmp := filepath.Join(dir, "bin.tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	if err := goIn(src, append([]string{"get"}, strings.Fields(get)...)...); err != nil {
		return "", err
	}
	if err := build(src, filepath.Join(tmp, name)); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(tmp, ".stamp"), []byte(extraKey(name)+"\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.RemoveAll(bin); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	tb.Logf("kubeenv: built %s in %v", name, time.Since(t0).Round(time.Second))
	if !extraCached(bin, name) {
		return "", fmt.Errorf("kubeenv: %s built but its cache does not validate", name)
	}
	return filepath.Join(bin, name), nil
}

// SourceDir returns the directory of the k8s.io/kubernetes module at Version
// in the module cache (after Agnhost, whose build downloads it): where the
// files the release's test images add beside their binaries live.
func SourceDir(tb testing.TB) string {
	tb.Helper()
	Agnhost(tb)
	gobin := "go"
	if _, err := exec.LookPath("go"); err != nil {
		gobin = "/usr/local/go/bin/go"
	}
	cmd := exec.Command(gobin, "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes")
	cmd.Dir = filepath.Join(extraDir("agnhost"), "src")
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "GOTOOLCHAIN=local")
	out, err := cmd.Output()
	dir := strings.TrimSpace(string(out))
	if err != nil || dir == "" {
		tb.Fatalf("kubeenv: go list -m k8s.io/kubernetes: %v %s", err, out)
	}
	return dir
}
