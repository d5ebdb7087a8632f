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
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv"
	"github.com/ipledger/ipledger/internal/testenv/buildcache"
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

// goMod is the build module's go.mod: k8s.io/kubernetes at Version, its
// staging modules at StagingVersion.
func goMod() string {
	var b strings.Builder
	fmt.Fprintf(&b, "require k8s.io/kubernetes %s\n\nreplace (\n", Version)
	for _, m := range stagingModules {
		fmt.Fprintf(&b, "\tk8s.io/%s => k8s.io/%s %s\n", m, m, StagingVersion)
	}
	b.WriteString(")\n")
	return buildcache.ModFile("kubebuild", b.String())
}

func ldflags() string {
	v := "k8s.io/component-base/version"
	minor := strings.Split(strings.TrimPrefix(Version, "v"), ".")[1]
	return fmt.Sprintf("-s -w -X %[1]s.gitVersion=%[2]s -X %[1]s.gitMajor=1 -X %[1]s.gitMinor=%[3]s -X %[1]s.gitTreeState=clean -X %[1]s.buildDate=1970-01-01T00:00:00Z", v, Version, minor)
}

// goIn runs the go command in the build module src as every build of the
// cache does (buildcache.GoEnv).
func goIn(src string, args ...string) error {
	_, err := buildcache.Go(src, nil, args...)
	return err
}

// kubeRecipe builds the Commands and etcd into CacheDir()/bin. Its key (the
// module, flags, etcd's version, the toolchain, the commands) is the one the
// cache has been stamped with since its first build: caches built before the
// recipe stay valid.
func kubeRecipe() buildcache.Recipe {
	return buildcache.Recipe{
		Name: "Kubernetes", Version: Version + " (" + strings.Join(Commands, ", ") + ", etcd " + EtcdModuleVersion + ")",
		Dir:     CacheDir(),
		Key:     []string{goMod(), ldflags(), EtcdModuleVersion, buildcache.Toolchain(), strings.Join(Commands, ",")},
		Outputs: append(append([]string(nil), Commands...), "etcd"),
		Cold:    12 * time.Minute,
		Build: func(src, out string) error {
			if err := buildcache.WriteModule(src, goMod()); err != nil {
				return err
			}
			var pkgs []string
			for _, c := range Commands {
				pkgs = append(pkgs, "k8s.io/kubernetes/cmd/"+c+"@"+Version)
			}
			if err := goIn(src, append([]string{"get"}, append(pkgs, "go.etcd.io/etcd/server/v3@"+EtcdModuleVersion)...)...); err != nil {
				return err
			}
			for _, c := range Commands {
				if err := goIn(src, "build", "-trimpath", "-ldflags", ldflags(), "-o", filepath.Join(out, c), "k8s.io/kubernetes/cmd/"+c); err != nil {
					return err
				}
			}
			return goIn(src, "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(out, "etcd"), "go.etcd.io/etcd/server/v3")
		},
	}
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// Binaries returns the directory holding the Commands and etcd, building them
// first unless the cache already has them (buildcache: a lock serializes the
// builds across processes). Under -short it skips tb: Start and StartAPIServer
// call it first, so every test that needs Kubernetes is left out of the fast tier.
func Binaries(tb testing.TB) string {
	tb.Helper()
	testenv.SkipIfShort(tb, "needs a Kubernetes build")
	if currentErr != nil {
		tb.Fatal(currentErr)
	}
	binOnce.Do(func() { binDir, binErr = buildcache.Ensure(kubeRecipe(), tb.Logf) })
	if binErr != nil {
		tb.Fatal(binErr)
	}
	return binDir
}

// ExtraBinary returns the path of the Kubernetes command name
// (k8s.io/kubernetes/cmd/NAME) outside Commands, built from the same module,
// flags and toolchain as Binaries into a directory of its own with its own
// stamp, under the same build lock; a warm run builds nothing. Under -short it
// skips tb, as Binaries does.
func ExtraBinary(tb testing.TB, name string) string {
	tb.Helper()
	pkg := "k8s.io/kubernetes/cmd/" + name
	return extra(tb, name, pkg+"@"+Version, 2*time.Minute, func(src, out string) error {
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
	e2eTest = extra(tb, "e2e.test", "-t "+pkg+"@"+Version, 2*time.Minute, func(src, out string) error {
		return goIn(src, "test", "-c", "-vet=off", "-trimpath", "-ldflags", ldflags(), "-o", out, pkg)
	})
	ginkgo = extra(tb, "ginkgo", "-t "+pkg+"@"+Version, 10*time.Second, func(src, out string) error {
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
	return extra(tb, name, pkg+"@"+Version, 30*time.Second, func(src, out string) error {
		return goIn(src, "build", "-trimpath", "-ldflags", "-s -w", "-o", out, pkg)
	})
}

// Agnhost returns the path of agnhost, the e2e suite's all-purpose test
// server and client (k8s.io/kubernetes/test/images/agnhost, part of the same
// module), built and cached as ExtraBinary builds.
func Agnhost(tb testing.TB) string {
	tb.Helper()
	const pkg = "k8s.io/kubernetes/test/images/agnhost"
	return extra(tb, "agnhost", pkg+"@"+Version, 30*time.Second, func(src, out string) error {
		return goIn(src, "build", "-trimpath", "-ldflags", "-s -w", "-o", out, pkg)
	})
}

// extraDir is where an extra command name is kept: a sibling of the main
// build's bin, with a stamp of its own, so adding an extra command never
// invalidates the Commands.
func extraDir(name string) string { return filepath.Join(CacheDir(), "extra", name) }

// extraRecipe builds the command name: `go get get` (its arguments,
// space-separated) in a module of its own pinned as the main build is, then
// build(src, out) writing it to out. Its key is the main recipe's stamp and
// the name; it shares the main build's lock (one module, one build at a time).
func extraRecipe(name, get string, cold time.Duration, build func(src, out string) error) buildcache.Recipe {
	return buildcache.Recipe{
		Name: name, Version: Version,
		Dir:      extraDir(name),
		LockFile: filepath.Join(CacheDir(), ".lock"),
		Key:      []string{kubeRecipe().Stamp(), name},
		Outputs:  []string{name},
		Cold:     cold,
		Build: func(src, out string) error {
			if err := buildcache.WriteModule(src, goMod()); err != nil {
				return err
			}
			if err := goIn(src, append([]string{"get"}, strings.Fields(get)...)...); err != nil {
				return err
			}
			return build(src, filepath.Join(out, name))
		},
	}
}

var (
	extraMu   sync.Mutex
	extraBins = map[string]string{}
)

// extra builds (once per process, and once per recipe on the machine) the
// extra command name. Under -short it skips tb.
func extra(tb testing.TB, name, get string, cold time.Duration, build func(src, out string) error) string {
	tb.Helper()
	testenv.SkipIfShort(tb, "needs a Kubernetes build")
	extraMu.Lock()
	defer extraMu.Unlock()
	if p, ok := extraBins[name]; ok {
		return p
	}
	r := extraRecipe(name, get, cold, build)
	if _, err := buildcache.Ensure(r, tb.Logf); err != nil {
		tb.Fatal(err)
	}
	extraBins[name] = r.Path(name)
	return extraBins[name]
}

// SourceDir returns the directory of the k8s.io/kubernetes module at Version
// in the module cache (after Agnhost, whose build downloads it): where the
// files the release's test images add beside their binaries live.
func SourceDir(tb testing.TB) string {
	tb.Helper()
	Agnhost(tb)
	dir, err := buildcache.ModuleDir(filepath.Join(extraDir("agnhost"), "src"), "k8s.io/kubernetes")
	if err != nil {
		tb.Fatalf("kubeenv: %v", err)
	}
	return dir
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
