package kubeenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/testenv/containerdenv"
	"github.com/ipledger/ipledger/internal/testenv/netnodes"
)

// A Node is one Kubernetes node sharing this machine with others: a network
// namespace of netnodes (its address on their bridge is its InternalIP), a
// mount namespace in which the paths a node's software expects (nodePaths) are
// directories of its own, a hostname, and its own containerd and kubelet. A
// manifest with fixed hostPaths (deploy/ipledger.yaml) applies unchanged on
// every node: each node's mount namespace is its filesystem.
//
// The namespaces are held by a process of their own (the holder); containerd
// and the kubelet join them with nsenter. The kubelet's cgroups are under a
// cgroupRoot of the node's own in every hierarchy, so kubelets never share a
// kubepods tree.
type Node struct {
	Name string
	// IP is the node's address (--node-ip, InternalIP).
	IP string
	// IP6 is the node's IPv6 address, its second --node-ip and InternalIP, in
	// a dual-stack cluster (Options.DualStack); empty otherwise.
	IP6 string
	// Host is the node's network namespace.
	Host *netnodes.Host
	// Dir holds the node's directories (what its mount namespace shows at
	// nodePaths), its configs and its logs' names in the cluster's logs/.
	Dir string

	c          *Cluster
	holder     *exec.Cmd
	holderDone chan struct{}
	mntNS      string // readlink of the holder's /proc/PID/ns/mnt
	cgroupRoot string
	made       []string // mount points created on the host, deepest last
	ctdVersion string   // the containerd the node runs (containerdenv's name)
	ctdBin     string   // the directory of its containerd, shim and ctr
}

// nodePaths are bind-mounted from the node's Dir over the host's paths inside
// the node's mount namespace.
var nodePaths = []string{
	"/etc/cni/net.d", "/opt/cni/bin",
	"/var/lib/ipledger", "/run/ipledger",
	// host-local's default dataDir (/var/lib/cni/networks) and flanneld's
	// subnet file (/run/flannel/subnet.env): each node's own.
	"/var/lib/cni", "/run/flannel",
	"/var/lib/kubelet", "/var/lib/containerd", "/run/containerd",
	"/var/log/pods", "/var/log/containers",
	"/run/netns",
}

// APIServiceIP is the kubernetes Service's ClusterIP (the first of
// --service-cluster-ip-range). With no kube-proxy, each node namespace holds it
// on its loopback with a relay to the apiserver behind it: the kubelet and the
// in-cluster clients of hostNetwork pods reach the apiserver there.
const APIServiceIP = "10.96.0.1"

// DNSServiceIP is the cluster DNS Service's ClusterIP, which every node's
// kubelet gives its pods (clusterDNS), as kubeadm does: the tenth address of
// the Service range.
const DNSServiceIP = "10.96.0.10"

// nodeSock is containerd's socket inside a node (the default path, which the
// manifests name).
const nodeSock = "/run/containerd/containerd.sock"

// AddNode starts a node named name in the network namespace h and waits until
// its Node object is registered (NotReady until a CNI config exists in the
// node's /etc/cni/net.d). images (docker archives) are imported into the
// node's containerd first. Everything is stopped by PID and removed at
// tb.Cleanup.
func (c *Cluster) AddNode(tb testing.TB, name string, h *netnodes.Host, images ...string) *Node {
	tb.Helper()
	n := &Node{Name: name, IP: h.Addr4.String(), Host: h, c: c, Dir: filepath.Join(c.Dir, "nodes", name), cgroupRoot: "/ipl-" + name}
	if c.opts.DualStack {
		n.IP6 = h.Addr6.String()
	}
	tb.Cleanup(func() { n.cleanup(tb) })
	c.nodesMu.Lock()
	c.nodes = append(c.nodes, n)
	c.nodesMu.Unlock()
	if err := n.start(tb, images); err != nil {
		n.dumpLogs(tb)
		tb.Fatalf("kubeenv: node %s: %v", name, err)
	}
	return n
}

func (n *Node) path(p string) string {
	return filepath.Join(n.Dir, "fs", strings.TrimPrefix(p, "/"))
}

// HostPath is the host's path of path as the node sees it (one of nodePaths or
// below one).
func (n *Node) HostPath(path string) string { return n.path(path) }

// NSPID is the PID of the process holding the node's namespaces: `nsenter -t
// PID --net --mount --uts` runs a command on the node.
func (n *Node) NSPID() int { return n.holder.Process.Pid }

// Endpoint is the node's CRI endpoint as the host reaches it.
func (n *Node) Endpoint() string { return "unix://" + n.path(nodeSock) }

func (n *Node) start(tb testing.TB, images []string) error {
	for _, p := range nodePaths {
		if err := os.MkdirAll(n.path(p), 0o755); err != nil {
			return err
		}
	}
	// containerd needs loopback in its bin dir; an installer adds its own.
	// Debian's portmap (CNI plugins 1.1.1, cniVersion 1.0.0 at most) is left
	// out: a pod network brings the portmap it needs (ipledger's image has
	// one that speaks 1.1.0; StartFlannel links Debian's).
	std, _ := filepath.Glob(filepath.Join(containerdenv.DefaultCNIBinDir, "*"))
	for _, p := range std {
		if filepath.Base(p) == "portmap" {
			continue
		}
		if err := os.Symlink(p, filepath.Join(n.path("/opt/cni/bin"), filepath.Base(p))); err != nil {
			return err
		}
	}
	if err := n.makeMountPoints(); err != nil {
		return err
	}
	if err := n.makeCgroupRoot(); err != nil {
		return err
	}
	if err := n.startHolder(); err != nil {
		return err
	}
	if err := n.startRelay(tb); err != nil {
		return err
	}
	if err := n.startContainerd(); err != nil {
		return err
	}
	_, tar, err := containerdenv.PauseImage()
	if err != nil {
		return err
	}
	for _, img := range append([]string{tar}, images...) {
		if err := n.ImportImage(img); err != nil {
			return err
		}
	}
	return n.startKubelet()
}

// makeMountPoints creates the nodePaths missing on the host (bind mounts need
// a directory to cover), recording them for cleanup.
func (n *Node) makeMountPoints() error {
	for _, p := range nodePaths {
		var missing []string
		for d := p; d != "/"; d = filepath.Dir(d) {
			if _, err := os.Stat(d); err == nil {
				break
			}
			missing = append([]string{d}, missing...)
		}
		for _, d := range missing {
			if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
			n.made = append(n.made, d)
		}
	}
	return nil
}

// cgroupHierarchies are the mounted cgroup v1 hierarchies (or the v2 root).
func cgroupHierarchies() []string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return []string{"/sys/fs/cgroup"}
	}
	var hs []string
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range ents {
		d := filepath.Join("/sys/fs/cgroup", e.Name())
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() {
			continue // the cpu,cpuacct symlinks
		}
		if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err == nil {
			hs = append(hs, d)
		}
	}
	return hs
}

// makeCgroupRoot creates the node's cgroupRoot in every hierarchy (the
// kubelet refuses a cgroupRoot that does not exist); cpuset gets its parent's
// cpus and mems, without which no task can join it.
func (n *Node) makeCgroupRoot() error {
	for _, h := range cgroupHierarchies() {
		d := h + n.cgroupRoot
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(h, f)); err == nil {
				if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
					return fmt.Errorf("%s/%s: %w", d, f, err)
				}
			}
		}
	}
	return nil
}

// startHolder starts the process that holds the node's namespaces: it enters
// the network namespace, unshares a mount (slave: the host's later mounts
// reach the node, the node's never reach the host) and a UTS namespace, mounts
// the node's sysfs, bind mounts the node's directories, sets the hostname and
// sleeps.
func (n *Node) startHolder() error {
	var sc strings.Builder
	sc.WriteString("set -e\n")
	// The node's own sysfs (its network namespace's interfaces in
	// /sys/class/net), with the host's cgroup hierarchies moved over from
	// the old one: the kubelet and containerd need them. (ip netns exec
	// mounts a fresh sysfs too, but loses /sys/fs/cgroup.)
	keep := filepath.Join(n.Dir, "cgroup-keep")
	fmt.Fprintf(&sc, "mkdir -p %[1]q\nmount --rbind /sys/fs/cgroup %[1]q\nmount -t sysfs sysfs /sys\nmount --move %[1]q /sys/fs/cgroup\n", keep)
	for _, p := range nodePaths {
		fmt.Fprintf(&sc, "mount --bind %q %q\n", n.path(p), p)
	}
	// containerd mounts the pods' namespaces here after the agent's pod started:
	// they reach it only through a shared mount (HostToContainer).
	sc.WriteString("mount --make-shared /run/netns\n")
	fmt.Fprintf(&sc, "hostname %q\n", n.Name)
	fmt.Fprintf(&sc, "touch %q\n", filepath.Join(n.Dir, "ready"))
	sc.WriteString("exec sleep 2147483647\n")
	lf, err := os.Create(filepath.Join(n.c.logDir, n.Name+"-holder.log"))
	if err != nil {
		return err
	}
	cmd := exec.Command("nsenter", "--net=/run/netns/"+n.Host.Netns, "--",
		"unshare", "--mount", "--uts", "--propagation", "slave", "--", "/bin/sh", "-c", sc.String())
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return err
	}
	n.holder, n.holderDone = cmd, make(chan struct{})
	go func() { cmd.Wait(); lf.Close(); close(n.holderDone) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-n.holderDone:
			return fmt.Errorf("namespace holder exited: %s", logTail(lf.Name(), 10))
		default:
		}
		if _, err := os.Stat(filepath.Join(n.Dir, "ready")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("namespace holder not ready after 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n.mntNS, err = os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", cmd.Process.Pid)); err != nil {
		return err
	}
	// cleanup kills what runs in this mount namespace: never the host's.
	if own, _ := os.Readlink("/proc/self/ns/mnt"); own == n.mntNS {
		n.mntNS = ""
		return errors.New("namespace holder shares the host's mount namespace")
	}
	return nil
}

// nsenter returns the nsenter arguments that run path in the node's
// namespaces.
func (n *Node) nsenter(path string, args ...string) []string {
	return append([]string{"-t", strconv.Itoa(n.holder.Process.Pid), "--net", "--mount", "--uts", "--", path}, args...)
}

// startRelay puts APIServiceIP on the node's loopback and relays its port 443
// to the apiserver on the host's loopback, until cleanup.
func (n *Node) startRelay(tb testing.TB) error {
	lo, err := n.Host.Netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	// Scope host: the node still answers it from anywhere, but never picks it
	// as the source of what it sends out of another link (its own connections
	// to pods, kube-proxy's masquerade), which keep the node's address.
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(APIServiceIP), Mask: net.CIDRMask(32, 32)}, Scope: int(netlink.SCOPE_HOST)}
	if err := n.Host.Netlink.AddrAdd(lo, addr); err != nil {
		return fmt.Errorf("%s on lo: %w", APIServiceIP, err)
	}
	return n.Host.Relay(tb, net.JoinHostPort(APIServiceIP, "443"), fmt.Sprintf("127.0.0.1:%d", n.c.apiPort))
}

// RelayAPI makes the apiserver answer on 127.0.0.1 at its port inside ns as
// on the host, so that a process run in ns (the e2e suite, in the namespace
// standing for the world outside the cluster) uses the admin kubeconfig
// unchanged. Until tb's cleanup.
func (c *Cluster) RelayAPI(tb testing.TB, ns *netnodes.NS) error {
	addr := fmt.Sprintf("127.0.0.1:%d", c.apiPort)
	return ns.Relay(tb, addr, addr)
}

// Containerd is the containerd version the node runs (containerdenv's
// selection: IPLEDGER_CONTAINERD, default containerdenv.DefaultVersion).
func (n *Node) Containerd() string { return n.ctdVersion }

// startContainerd starts the node's containerd: containerdenv's build of the
// selected version (Debian's from /usr/bin for "debian") with containerdenv's
// configuration for that version, at the default paths inside the node's
// mount namespace.
func (n *Node) startContainerd() error {
	if n.ctdBin == "" {
		v, err := containerdenv.Selected()
		if err != nil {
			return err
		}
		if n.ctdBin, err = containerdenv.Binaries(v, n.c.tb.Logf); err != nil {
			return err
		}
		n.ctdVersion = v
	}
	pause, _, err := containerdenv.PauseImage()
	if err != nil {
		return err
	}
	cfg := filepath.Join(n.Dir, "containerd.toml")
	conf := containerdenv.Config{
		Root: "/var/lib/containerd", State: "/run/containerd", Socket: nodeSock,
		Sandbox: pause, Snapshotter: "overlayfs",
		CNIBinDir: "/opt/cni/bin", CNIConfDir: "/etc/cni/net.d",
		// The pods' namespaces in /run/netns (the node's own), where the
		// manifest's agent looks for them.
		NetnsUnderState: false,
		MetricsAddress:  ContainerdMetricsAddr,
	}
	if err := os.WriteFile(cfg, []byte(conf.Render(containerdenv.Major(n.ctdVersion))), 0o644); err != nil {
		return err
	}
	// env sets the PATH containerd finds its shim (and runc) on.
	ctd := []string{"PATH=" + containerdenv.SearchPath(n.ctdBin), filepath.Join(n.ctdBin, "containerd"), "--config", cfg}
	name := n.Name + "-containerd"
	if err := n.c.spawnPath(name, "nsenter", n.nsenter("/usr/bin/env", ctd...)...); err != nil {
		return err
	}
	deadline := time.Now().Add(n.c.opts.StartTimeout)
	var last error
	for time.Now().Before(deadline) {
		if err := n.c.procErr(name); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		cl, err := cri.Dial(ctx, n.Endpoint(), 2*time.Second)
		cancel()
		if err == nil {
			cl.Close()
			return nil
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("containerd not ready after %v: %v", n.c.opts.StartTimeout, last)
}

// StopContainerd stops the node's containerd by PID (SIGTERM), as `systemctl stop
// containerd` does: the pods' shims and containers keep running.
func (n *Node) StopContainerd() { n.c.stopProc(n.Name + "-containerd") }

// StartContainerd starts the node's containerd again, with the same
// configuration, and waits until its CRI answers.
func (n *Node) StartContainerd() error { return n.startContainerd() }

// ImportImage imports a docker-archive into the node's containerd.
func (n *Node) ImportImage(path string) error {
	out, err := exec.Command(filepath.Join(n.ctdBin, "ctr"), "--address", n.path(nodeSock), "-n", "k8s.io", "images", "import", "--snapshotter", "overlayfs", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr images import %s: %v\n%s", path, err, out)
	}
	return nil
}

func (n *Node) startKubelet() error {
	p := n.c.pki
	client, serving := n.Name+"-node", n.Name+"-kubelet-serving"
	if err := p.issue(client, "system:node:"+n.Name, []string{"system:nodes"}, false, nil, nil); err != nil {
		return err
	}
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(n.IP)}
	if n.IP6 != "" {
		ips = append(ips, net.ParseIP(n.IP6))
	}
	if err := p.issue(serving, n.Name, nil, true, ips, []string{n.Name}); err != nil {
		return err
	}
	kc := filepath.Join(n.Dir, "kubelet.kubeconfig")
	if err := p.kubeconfig(kc, "https://"+net.JoinHostPort(APIServiceIP, "443"), client); err != nil {
		return err
	}
	resolv := filepath.Join(n.Dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+netnodes.OutsideV4.String()+"\n"), 0o644); err != nil {
		return err
	}
	maxPods := n.c.opts.MaxPods
	if maxPods <= 0 {
		maxPods = 110
	}
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: %[2]s.crt
tlsPrivateKeyFile: %[2]s.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[3]s}
authorization: {mode: Webhook}
failCgroupV1: false
cgroupDriver: cgroupfs
# Every kubelet on this machine has a tree of its own in every hierarchy.
cgroupRoot: %[4]s
containerRuntimeEndpoint: unix://%[5]s
failSwapOn: false
clusterDomain: cluster.local
clusterDNS: [%[6]s]
# The nodes' upstream resolver is the outside namespace, which answers
# nothing: names outside the cluster fail fast, whatever the host uses.
resolvConf: %[7]s
podLogsDir: /var/log/pods
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: %[8]d
`, n.IP, p.path(serving), p.path("ca.crt"), n.cgroupRoot, nodeSock, DNSServiceIP, resolv, maxPods)
	cfgPath := filepath.Join(n.Dir, "kubelet.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	name := n.Name + "-kubelet"
	if err := n.c.spawnPath(name, "nsenter", n.nsenter(filepath.Join(n.c.Bin, "kubelet"),
		"--config", cfgPath, "--kubeconfig", kc, "--root-dir", "/var/lib/kubelet",
		"--hostname-override", n.Name, "--node-ip", n.nodeIPs(), "--v", "1")...); err != nil {
		return err
	}
	deadline := time.Now().Add(n.c.opts.StartTimeout)
	for time.Now().Before(deadline) {
		if err := n.c.procErr(name); err != nil {
			return err
		}
		if _, err := n.c.Kubectl("get", "node", n.Name); err == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("node not registered after %v", n.c.opts.StartTimeout)
}

// Log returns the last lines of the node's containerd or kubelet log.
func (n *Node) Log(component string, lines int) string {
	return n.c.Log(n.Name+"-"+component, lines)
}

func (n *Node) dumpLogs(tb testing.TB) {
	for _, comp := range []string{"holder", "containerd", "kubelet", "kube-proxy", "flanneld"} {
		if s := n.Log(comp, 30); s != "" {
			tb.Logf("---- %s %s log, last lines:\n%s", n.Name, comp, s)
		}
	}
}

// cleanup stops the kubelet, removes the sandboxes through containerd (CNI
// DEL), stops containerd, kills by PID what is left in the node's cgroups and
// mount namespace (shims, pause and container processes), then the holder
// (the mount namespace and its mounts go with it), and removes the node's
// cgroups, the mount points it created on the host and its directory.
func (n *Node) cleanup(tb testing.TB) {
	if tb.Failed() {
		n.dumpLogs(tb)
	}
	n.c.stopProc(n.Name + "-flanneld")
	n.c.stopProc(n.Name + "-kube-proxy")
	n.c.stopProc(n.Name + "-kubelet")
	if n.c.procErr(n.Name+"-containerd") == nil {
		removeSandboxes(tb, n.Endpoint())
	}
	n.c.stopProc(n.Name + "-containerd")
	for pass := 0; pass < 3; pass++ {
		left := n.pids()
		if len(left) == 0 {
			break
		}
		for _, pid := range left {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n.holder != nil {
		n.holder.Process.Kill()
		<-n.holderDone
	}
	for _, h := range cgroupHierarchies() {
		if err := rmdirTree(h + n.cgroupRoot); err != nil {
			tb.Errorf("kubeenv: node %s cleanup: %v", n.Name, err)
		}
	}
	for i := len(n.made) - 1; i >= 0; i-- {
		if err := os.Remove(n.made[i]); err != nil {
			tb.Errorf("kubeenv: node %s cleanup: %v", n.Name, err)
		}
	}
	if err := os.RemoveAll(n.Dir); err != nil {
		tb.Errorf("kubeenv: node %s cleanup: %v", n.Name, err)
	}
}

// pids are the processes in the node's cgroups or its mount namespace, but
// the holder.
func (n *Node) pids() []int {
	set := map[int]bool{}
	for _, h := range cgroupHierarchies() {
		_ = filepath.WalkDir(h+n.cgroupRoot, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					set[pid] = true
				}
			}
			return nil
		})
	}
	if n.mntNS != "" {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); l == n.mntNS {
				set[pid] = true
			}
		}
	}
	if n.holder != nil {
		delete(set, n.holder.Process.Pid)
	}
	var pids []int
	for pid := range set {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	return pids
}

// removeSandboxes stops and removes every sandbox of the runtime at endpoint.
func removeSandboxes(tb testing.TB, endpoint string) {
	ctx := context.Background()
	c, err := cri.Dial(ctx, endpoint, 30*time.Second)
	if err != nil {
		tb.Logf("kubeenv cleanup: %v", err)
		return
	}
	defer c.Close()
	sbs, err := c.ListSandboxes(ctx)
	if err != nil {
		tb.Logf("kubeenv cleanup: %v", err)
		return
	}
	for _, s := range sbs {
		if err := c.StopPodSandbox(ctx, s.ID); err != nil && !errors.Is(err, cri.ErrNotFound) {
			tb.Logf("kubeenv cleanup: %v", err)
		}
		if err := c.RemovePodSandbox(ctx, s.ID); err != nil && !errors.Is(err, cri.ErrNotFound) {
			tb.Logf("kubeenv cleanup: %v", err)
		}
	}
}

// relayProxyName labels the kubernetes Service as served by another proxy
// (service.kubernetes.io/service-proxy-name): kube-proxy then leaves it alone.
// The apiserver keeps no endpoints for it (--endpoint-reconciler-type none),
// and kube-proxy would reject new connections to a Service without endpoints,
// the relay's on APIServiceIP among them.
const relayProxyName = "kubeenv-relay"

// kubeProxyHealthz is where each node's kube-proxy serves healthz, on the
// node's own loopback.
const kubeProxyHealthz = "127.0.0.1:10256"

// StartKubeProxy runs kube-proxy (ExtraBinary) on the node in iptables mode,
// reaching the apiserver through the node's relay, and waits until it reports
// healthy (its first sync done). Its rules live in the node's network
// namespace and go with it; the process is stopped by PID at node cleanup.
// It leaves nf_conntrack_max alone (the host's, read-only in a node's
// namespace: --conntrack-max-per-core 0) and sets the TCP established and
// CLOSE_WAIT timeouts to its defaults as on a real node (per network
// namespace: the host's stay as they are). podCIDR is its --cluster-cidr,
// the range of the pods' addresses (one CIDR per family, joined with ","):
// traffic to a ClusterIP from outside it is masqueraded. Empty means the
// controller's ClusterCIDRs (the Nodes' podCIDRs, both families in a
// dual-stack cluster); a pod network whose pods are elsewhere (ipledger's
// cluster mode: its pools) must give its own, as its operators must.
func (n *Node) StartKubeProxy(tb testing.TB, podCIDR string) {
	if podCIDR == "" {
		podCIDR = strings.Join(n.c.ClusterCIDRs(), ",")
	}
	tb.Helper()
	bin := ExtraBinary(tb, "kube-proxy")
	if _, err := n.c.Kubectl("label", "--overwrite", "service", "kubernetes", "-n", "default",
		"service.kubernetes.io/service-proxy-name="+relayProxyName); err != nil {
		tb.Fatalf("kubeenv: node %s: %v", n.Name, err)
	}
	client := n.Name + "-kube-proxy"
	if err := n.c.pki.issue(client, "system:kube-proxy", nil, false, nil, nil); err != nil {
		tb.Fatal(err)
	}
	kc := filepath.Join(n.Dir, "kube-proxy.kubeconfig")
	if err := n.c.pki.kubeconfig(kc, "https://"+net.JoinHostPort(APIServiceIP, "443"), client); err != nil {
		tb.Fatal(err)
	}
	name := n.Name + "-kube-proxy"
	if err := n.c.spawnPath(name, "nsenter", n.nsenter(bin,
		"--kubeconfig", kc, "--proxy-mode", "iptables", "--hostname-override", n.Name,
		"--cluster-cidr", podCIDR, "--nodeport-addresses", "primary",
		"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", kubeProxyHealthz,
		"--conntrack-max-per-core", "0", "--conntrack-min", "0",
		"--v", "1")...); err != nil {
		tb.Fatal(err)
	}
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return n.Host.Dial(network, addr, 2*time.Second)
		}}}
	var last error
	deadline := time.Now().Add(n.c.opts.StartTimeout)
	for time.Now().Before(deadline) {
		if err := n.c.procErr(name); err != nil {
			tb.Fatalf("kubeenv: node %s: %v", n.Name, err)
		}
		resp, err := hc.Get("http://" + kubeProxyHealthz + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			err = fmt.Errorf("healthz: %s", resp.Status)
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	tb.Fatalf("kubeenv: node %s: kube-proxy not healthy after %v: %v\n%s", n.Name, n.c.opts.StartTimeout, last, n.Log("kube-proxy", 30))
}

// StopKubeProxy stops the node's kube-proxy by PID (SIGTERM, then SIGKILL), so
// that a test sharing the node can start it again (another --cluster-cidr).
// Its rules stay in the node's namespace until the next kube-proxy syncs them.
func (n *Node) StopKubeProxy() { n.c.stopProc(n.Name + "-kube-proxy") }
