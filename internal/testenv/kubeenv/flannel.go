package kubeenv

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
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

// FlannelModule at FlannelVersion is the flannel the benchmark runs beside
// ipledger (flanneld, kube subnet manager, host-gw backend).
const (
	FlannelModule  = "github.com/flannel-io/flannel"
	FlannelVersion = "v0.28.10"
)

// flannelDropped are the backend imports taken out of flannel's main.go before
// the build: tencentvpc needs a module the proxy here does not serve, udp needs
// cgo (the build is CGO_ENABLED=0). host-gw, the one measured, stays.
var flannelDropped = []string{
	`_ "github.com/flannel-io/flannel/pkg/backend/tencentvpc"`,
	`_ "github.com/flannel-io/flannel/pkg/backend/udp"`,
}

func flannelLdflags() string {
	return "-s -w -X github.com/flannel-io/flannel/pkg/version.Version=" + FlannelVersion
}

// FlannelCacheDir is where flanneld of FlannelVersion is built and kept: beside
// CacheDir, $IPLEDGER_KUBE_CACHE/../flannel/FlannelVersion (default
// /var/cache/ipledger/flannel/FlannelVersion).
func FlannelCacheDir() string {
	return filepath.Join(filepath.Dir(filepath.Dir(CacheDir())), "flannel", FlannelVersion)
}

// flannelKey is the recipe of the flanneld build: module, version, flags, the
// dropped backends, the toolchain. The cache is valid while bin/.stamp holds it.
func flannelKey() string {
	h := sha256.Sum256([]byte(FlannelModule + "@" + FlannelVersion + "\x00" + flannelLdflags() + "\x00" +
		strings.Join(flannelDropped, ",") + "\x00" + runtime.Version()))
	return hex.EncodeToString(h[:])[:16]
}

func flannelCached(bin string) bool {
	stamp, err := os.ReadFile(filepath.Join(bin, ".stamp"))
	if err != nil || strings.TrimSpace(string(stamp)) != flannelKey() {
		return false
	}
	fi, err := os.Stat(filepath.Join(bin, "flanneld"))
	return err == nil && fi.Size() > 0
}

var (
	flannelOnce sync.Once
	flannelBin  string
	flannelErr  error
)

// FlannelBinary returns the path of flanneld FlannelVersion, built from its Go
// module (the source as the module proxy serves it, with its own go.mod and
// go.sum) with -trimpath and CGO_ENABLED=0, cached by version with a stamp and
// built under a lock as Binaries does; a warm run builds nothing. Under -short
// it skips tb.
func FlannelBinary(tb testing.TB) string {
	tb.Helper()
	testenv.SkipIfShort(tb, "needs a flannel build")
	flannelOnce.Do(func() { flannelBin, flannelErr = ensureFlannel(tb) })
	if flannelErr != nil {
		tb.Fatal(flannelErr)
	}
	return flannelBin
}

func ensureFlannel(tb testing.TB) (string, error) {
	dir := FlannelCacheDir()
	bin := filepath.Join(dir, "bin")
	if flannelCached(bin) {
		return filepath.Join(bin, "flanneld"), nil
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
	if flannelCached(bin) {
		return filepath.Join(bin, "flanneld"), nil
	}
	t0 := time.Now()
	tb.Logf("kubeenv: building flanneld %s into %s", FlannelVersion, bin)
	// The module's source as downloaded (read-only in the module cache), copied
	// to src/ so that it builds as the main module, with its own go.sum.
	dl := filepath.Join(dir, "dl")
	if err := os.MkdirAll(dl, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dl, "go.mod"), []byte("module ipledger.test/flanneldl\n\ngo 1.26.0\n"), 0o644); err != nil {
		return "", err
	}
	out, err := goOut(dl, "mod", "download", "-json", FlannelModule+"@"+FlannelVersion)
	if err != nil {
		return "", err
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("kubeenv: go mod download %s@%s: %v %s", FlannelModule, FlannelVersion, err, mod.Error)
	}
	src := filepath.Join(dir, "src")
	if err := os.RemoveAll(src); err != nil {
		return "", err
	}
	if out, err := exec.Command("cp", "-r", mod.Dir, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("kubeenv: copy %s: %v: %s", mod.Dir, err, out)
	}
	if out, err := exec.Command("chmod", "-R", "u+w", src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("kubeenv: chmod %s: %v: %s", src, err, out)
	}
	mainGo := filepath.Join(src, "main.go")
	b, err := os.ReadFile(mainGo)
	if err != nil {
		return "", err
	}
	for _, imp := range flannelDropped {
		if !bytes.Contains(b, []byte(imp)) {
			return "", fmt.Errorf("kubeenv: flannel %s main.go does not import %s", FlannelVersion, imp)
		}
		b = bytes.Replace(b, []byte(imp), nil, 1)
	}
	if err := os.WriteFile(mainGo, b, 0o644); err != nil {
		return "", err
	}
	tmp := filepath.Join(dir, "bin.tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	if err := goIn(src, "build", "-trimpath", "-ldflags", flannelLdflags(), "-o", filepath.Join(tmp, "flanneld"), "."); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(tmp, ".stamp"), []byte(flannelKey()+"\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.RemoveAll(bin); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	tb.Logf("kubeenv: built flanneld %s in %v", FlannelVersion, time.Since(t0).Round(time.Second))
	if !flannelCached(bin) {
		return "", fmt.Errorf("kubeenv: flanneld built but its cache does not validate")
	}
	return filepath.Join(bin, "flanneld"), nil
}

// goOut is goIn returning stdout.
func goOut(src string, args ...string) ([]byte, error) {
	gobin := "go"
	if _, err := exec.LookPath("go"); err != nil {
		gobin = "/usr/local/go/bin/go"
	}
	cmd := exec.Command(gobin, args...)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod -buildvcs=false", "GOWORK=off", "GOTOOLCHAIN=local")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("kubeenv: go %s: %v\n%s", strings.Join(args, " "), err, tail(stderr.String(), 40))
	}
	return out, nil
}

// FlannelHostGW is a flannel net-conf.json for the host-gw backend over
// clusterCIDR (the Nodes' podCIDRs must lie inside it).
func FlannelHostGW(clusterCIDR string) string {
	return fmt.Sprintf(`{"Network": %q, "EnableIPv4": true, "EnableIPv6": false, "Backend": {"Type": "host-gw"}}`, clusterCIDR)
}

// flannelSubnetFile is flanneld's --subnet-file, its default (a node path:
// each node's own).
const flannelSubnetFile = "/run/flannel/subnet.env"

// StartFlannel runs flanneld (FlannelBinary) on the node as a process, not a
// pod, in the node's network, mount and UTS namespaces (nsenter, as the
// kubelet runs): the kube subnet manager (--kube-subnet-mgr, NODE_NAME the
// Node), netConf as its net-conf.json, --iface the node's link on the shared
// L2 network. It reaches the apiserver through the node's relay as a client of
// its own in system:masters (the benchmark grants no narrower role), and adds
// its routes and iptables rules only in the node's network namespace. It waits
// until flanneld has written its subnet file (its lease acquired, the backend
// up). Stopped by PID with StopFlannel or at node cleanup.
func (n *Node) StartFlannel(tb testing.TB, netConf string) {
	tb.Helper()
	bin := FlannelBinary(tb)
	client := n.Name + "-flanneld"
	if err := n.c.pki.issue(client, "flanneld:"+n.Name, []string{"system:masters"}, false, nil, nil); err != nil {
		tb.Fatal(err)
	}
	dir := filepath.Join(n.Dir, "flannel")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	kc := filepath.Join(dir, "kubeconfig")
	if err := n.c.pki.kubeconfig(kc, "https://"+net.JoinHostPort(APIServiceIP, "443"), client); err != nil {
		tb.Fatal(err)
	}
	conf := filepath.Join(dir, "net-conf.json")
	if err := os.WriteFile(conf, []byte(netConf), 0o644); err != nil {
		tb.Fatal(err)
	}
	subnetEnv := n.path(flannelSubnetFile)
	_ = os.Remove(subnetEnv)
	name := n.Name + "-flanneld"
	// env execs flanneld: the PID spawned is flanneld's own.
	if err := n.c.spawnPath(name, "nsenter", n.nsenter("/usr/bin/env",
		"NODE_NAME="+n.Name, "POD_NAME=flanneld-"+n.Name, "POD_NAMESPACE=kube-flannel",
		bin, "--kube-subnet-mgr", "--kubeconfig-file", kc, "--iface", n.Host.Link,
		"--net-config-path", conf, "--subnet-file", flannelSubnetFile, "--ip-masq=false")...); err != nil {
		tb.Fatal(err)
	}
	deadline := time.Now().Add(n.c.opts.StartTimeout)
	for time.Now().Before(deadline) {
		if err := n.c.procErr(name); err != nil {
			tb.Fatalf("kubeenv: node %s: %v", n.Name, err)
		}
		if b, err := os.ReadFile(subnetEnv); err == nil && bytes.Contains(b, []byte("FLANNEL_SUBNET=")) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	tb.Fatalf("kubeenv: node %s: flanneld wrote no %s after %v\n%s", n.Name, flannelSubnetFile, n.c.opts.StartTimeout, n.Log("flanneld", 30))
}

// FlannelPID is the PID of the node's flanneld (0 when not started).
func (n *Node) FlannelPID() int { return n.c.pid(n.Name + "-flanneld") }

// StopFlannel stops the node's flanneld by PID (SIGTERM, then SIGKILL). Its
// routes and rules stay in the node's namespace, as flanneld leaves them.
func (n *Node) StopFlannel() { n.c.stopProc(n.Name + "-flanneld") }
