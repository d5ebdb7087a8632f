package kubeenv

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv"
	"github.com/ipledger/ipledger/internal/testenv/buildcache"
	"github.com/ipledger/ipledger/internal/testenv/containerdenv"
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

// flannelRecipe builds flanneld from its Go module's source (copied to src,
// built as the main module with its own go.mod and go.sum), the dropped
// backends taken out of main.go. Its key (module, version, flags, the dropped
// backends, the toolchain) is the one the cache was stamped with before.
func flannelRecipe() buildcache.Recipe {
	return buildcache.Recipe{
		Name: "flanneld", Version: FlannelVersion,
		Dir:     FlannelCacheDir(),
		Key:     []string{FlannelModule + "@" + FlannelVersion, flannelLdflags(), strings.Join(flannelDropped, ","), buildcache.Toolchain()},
		Outputs: []string{"flanneld"},
		Cold:    3 * time.Minute,
		Build: func(src, out string) error {
			if err := buildcache.CopyModule(filepath.Dir(src), FlannelModule, FlannelVersion, src); err != nil {
				return err
			}
			mainGo := filepath.Join(src, "main.go")
			b, err := os.ReadFile(mainGo)
			if err != nil {
				return err
			}
			for _, imp := range flannelDropped {
				if !bytes.Contains(b, []byte(imp)) {
					return fmt.Errorf("kubeenv: flannel %s main.go does not import %s", FlannelVersion, imp)
				}
				b = bytes.Replace(b, []byte(imp), nil, 1)
			}
			if err := os.WriteFile(mainGo, b, 0o644); err != nil {
				return err
			}
			return goIn(src, "build", "-trimpath", "-ldflags", flannelLdflags(), "-o", filepath.Join(out, "flanneld"), ".")
		},
	}
}

var (
	flannelOnce sync.Once
	flannelBin  string
	flannelErr  error
)

// FlannelBinary returns the path of flanneld FlannelVersion, built from its Go
// module (the source as the module proxy serves it, with its own go.mod and
// go.sum) with -trimpath and CGO_ENABLED=0, cached by version (buildcache); a
// warm run builds nothing. Under -short it skips tb.
func FlannelBinary(tb testing.TB) string {
	tb.Helper()
	testenv.SkipIfShort(tb, "needs a flannel build")
	flannelOnce.Do(func() {
		r := flannelRecipe()
		_, flannelErr = buildcache.Ensure(r, tb.Logf)
		flannelBin = r.Path("flanneld")
	})
	if flannelErr != nil {
		tb.Fatal(flannelErr)
	}
	return flannelBin
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
	// flannel's conflist chains portmap: the node's, or Debian's, as an
	// operator installing flannel puts the CNI plugins in place.
	pm := n.path("/opt/cni/bin/portmap")
	if _, err := os.Lstat(pm); errors.Is(err, os.ErrNotExist) {
		if err := os.Symlink(filepath.Join(containerdenv.DefaultCNIBinDir, "portmap"), pm); err != nil {
			tb.Fatal(err)
		}
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
