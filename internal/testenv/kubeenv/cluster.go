package kubeenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/containerdenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// Options configures a Cluster.
type Options struct {
	// Images are docker-archive tarballs imported into the node's containerd
	// (namespace k8s.io) before the kubelet starts: there is no registry.
	Images []string
	// NodeName of the one node (default "ipledger-node").
	NodeName string
	// StartTimeout bounds the bring-up of each component (default 60s).
	StartTimeout time.Duration
	// ClusterCIDR is the pod range kube-controller-manager splits into the Nodes'
	// podCIDRs (--allocate-node-cidrs, /24 each; default 10.236.0.0/16, so the
	// first Node gets 10.236.0.0/24), as kubeadm's --pod-network-cidr sets it up.
	ClusterCIDR string
	// AfterRestore, when set, runs once the cluster is stopped and the host
	// restored, while this cluster still holds the host-wide lock (no other
	// cluster can have changed the host yet): where a test checks the host.
	AfterRestore func()
	// MaxPods is each kubelet node's maxPods (AddNode; default 110, the
	// kubelet's own default). A Node's podCIDR (/24) holds 254 addresses.
	MaxPods int
	// DualStack makes the cluster of StartControlPlane IPv4/IPv6 dual-stack,
	// as kubeadm's podSubnet and serviceSubnet with two CIDRs do: Services
	// from ServiceCIDR and ServiceCIDR6, each Node a podCIDR of each family
	// (a /24 of ClusterCIDR, a /64 of ClusterCIDR6), each kubelet of AddNode
	// its node's IPv4 and IPv6 addresses as --node-ip, and kube-proxy both
	// pod ranges as --cluster-cidr. IPv4 stays the primary family. Start (one
	// node on the host's own address) refuses it.
	DualStack bool
}

// ClusterCIDR is the IPv4 pod range the Nodes' podCIDRs are allocated from
// (ClusterCIDRs has both of a dual-stack cluster).
func (c *Cluster) ClusterCIDR() string { return c.opts.ClusterCIDR }

// APIPort is the kube-apiserver's port on 127.0.0.1.
func (c *Cluster) APIPort() int { return c.apiPort }

// Cluster is a running one-node cluster.
type Cluster struct {
	tb   testing.TB
	opts Options

	// Dir holds the cluster's files: pki/, kubeconfigs, logs/, kubelet/, etcd/.
	Dir        string
	Bin        string
	Kubeconfig string
	// EtcdURL is the control plane's etcd (client URL, loopback).
	EtcdURL  string
	NodeName string
	NodeIP   string
	// Containerd is the node's runtime.
	Containerd *containerdenv.Env
	// CNIBinDir and CNIConfDir are the node's CNI dirs (what a CNI installer
	// writes to); NetnsDir is where containerd mounts the pods' namespaces
	// (a shared mount, as the runtime requires for HostToContainer).
	CNIBinDir, CNIConfDir, NetnsDir string

	apiPort int
	// apiArgs are the kube-apiserver's arguments (StartAPIServer).
	apiArgs []string
	pki     *pki
	// egress is the apiserver's egress selector configuration (nodes in
	// namespaces of their own only; see egress.go).
	egress string

	nodesMu sync.Mutex
	nodes   []*Node

	host *hostState
	*runner
}

// Start builds (or takes from the cache) the Kubernetes binaries, starts a
// private containerd, etcd, the control plane and a kubelet, and waits until
// the node is registered. The node is NotReady until a CNI config is written
// to CNIConfDir. Everything is stopped by PID and the host restored at
// tb.Cleanup.
func Start(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	if opts.NodeName == "" {
		opts.NodeName = "ipledger-node"
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 60 * time.Second
	}
	if opts.ClusterCIDR == "" {
		opts.ClusterCIDR = DefaultClusterCIDR
	}
	if opts.DualStack {
		tb.Fatal("kubeenv: Options.DualStack is for StartControlPlane and AddNode (nodes on netnodes' bridge, which has both families); Start's node is the host itself, whose addresses are not the test's to choose")
	}
	bin := Binaries(tb)
	// One cluster per host at a time: kubelets share the kubepods cgroups and
	// the KUBE-* iptables chains, and each restores the host as it found it.
	// (go test ./... runs packages in parallel; see hostLock.) The next cluster
	// of this process may start after cleanup.
	tb.Cleanup(hostLock(tb)) // runs after every cleanup registered below
	if opts.AfterRestore != nil {
		tb.Cleanup(opts.AfterRestore)
	}
	dir, err := os.MkdirTemp("/tmp", "kube")
	if err != nil {
		tb.Fatal(err)
	}
	c := &Cluster{tb: tb, opts: opts, Dir: dir, Bin: bin, NodeName: opts.NodeName, runner: newRunner(tb, dir, bin, opts.StartTimeout),
		Kubeconfig: filepath.Join(dir, "admin.kubeconfig"),
		CNIBinDir:  filepath.Join(dir, "cni-bin"), CNIConfDir: filepath.Join(dir, "net.d")}
	c.NodeIP, err = nodeIP()
	if err != nil {
		os.RemoveAll(dir)
		tb.Fatal(err)
	}
	for _, d := range []string{c.CNIBinDir, c.CNIConfDir, filepath.Join(dir, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	// The node's CNI bin dir starts with the standard plugins (containerd needs
	// loopback); an installer adds its own next to them.
	std, _ := filepath.Glob(filepath.Join(containerdenv.DefaultCNIBinDir, "*"))
	for _, p := range std {
		if err := os.Symlink(p, filepath.Join(c.CNIBinDir, filepath.Base(p))); err != nil {
			tb.Fatal(err)
		}
	}
	// Recorded before any of our processes runs (a crashed earlier run's
	// leftovers are not ours to remove).
	c.host, err = saveHost()
	if err != nil {
		os.RemoveAll(dir)
		tb.Fatal(err)
	}
	// The cluster's directory is removed after containerd's own cleanup has
	// stopped it (cleanups run last registered first): a running containerd
	// makes its CNI conf dir again when it is removed, which left a /tmp/kube*
	// directory holding an empty net.d/ after every one-node cluster.
	tb.Cleanup(c.removeDir)
	c.Containerd = containerdenv.Start(tb, containerdenv.Options{CNIConfDir: c.CNIConfDir, CNIBinDir: c.CNIBinDir})
	tb.Cleanup(c.cleanup)
	c.NetnsDir = filepath.Join(c.Containerd.StateDir(), "io.containerd.grpc.v1.cri", "netns")
	if err := sharedMount(c.NetnsDir); err != nil {
		tb.Fatal(err)
	}
	for _, img := range opts.Images {
		if err := c.ImportImage(img); err != nil {
			tb.Fatal(err)
		}
	}
	if err := c.startControlPlane(); err != nil {
		c.dumpLogs()
		tb.Fatal(err)
	}
	if err := c.startKubelet(); err != nil {
		c.dumpLogs()
		tb.Fatal(err)
	}
	return c
}

// StartControlPlane builds (or takes from the cache) the Kubernetes binaries and
// starts etcd, kube-apiserver, kube-controller-manager (allocating the Nodes'
// podCIDRs from opts.ClusterCIDR) and kube-scheduler on the host's loopback,
// with no node: nodes join with AddNode. It holds the host-wide cluster lock
// (kubelets change host sysctls) and restores the host at tb.Cleanup.
func StartControlPlane(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 60 * time.Second
	}
	if opts.ClusterCIDR == "" {
		opts.ClusterCIDR = DefaultClusterCIDR
	}
	bin := Binaries(tb)
	tb.Cleanup(hostLock(tb))
	if opts.AfterRestore != nil {
		tb.Cleanup(opts.AfterRestore)
	}
	dir, err := os.MkdirTemp("/tmp", "kube")
	if err != nil {
		tb.Fatal(err)
	}
	c := &Cluster{tb: tb, opts: opts, Dir: dir, Bin: bin, runner: newRunner(tb, dir, bin, opts.StartTimeout),
		Kubeconfig: filepath.Join(dir, "admin.kubeconfig")}
	if c.NodeIP, err = nodeIP(); err != nil {
		os.RemoveAll(dir)
		tb.Fatal(err)
	}
	if c.host, err = saveHost(); err != nil {
		os.RemoveAll(dir)
		tb.Fatal(err)
	}
	tb.Cleanup(c.cleanup)
	if c.egress, err = c.startEgress(); err != nil {
		tb.Fatal(err)
	}
	if err := c.startControlPlane(); err != nil {
		c.dumpLogs()
		tb.Fatal(err)
	}
	return c
}

// hostLockPath is the file of the host-wide cluster lock (a variable for the
// lock's own test).
var hostLockPath = func() string { return filepath.Join(filepath.Dir(CacheDir()), ".cluster.lock") }

// hostLockState is this process's share of the host-wide cluster lock: the
// open file whose flock it holds once its first cluster took it, and the
// mutex that lets one cluster of this process run at a time.
var hostLockState struct {
	sync.Mutex // one cluster of this process at a time
	held       *os.File
}

// hostLock makes tb's cluster the one cluster on this host: it waits for this
// process's previous cluster to end and, the first time, takes the host-wide
// file lock, which this process then keeps until it exits (the kernel drops it
// with the file). So packages that go test runs side by side take turns as
// wholes: a package waits at most once, for the package holding the lock,
// instead of waiting between each of its tests for the other's next one. The
// returned release lets this process's next cluster start.
func hostLock(tb testing.TB) func() {
	tb.Helper()
	hostLockState.Lock()
	if hostLockState.held == nil {
		f, err := takeHostLock(tb)
		if err != nil {
			hostLockState.Unlock()
			tb.Fatal(err)
		}
		hostLockState.held = f
	}
	return hostLockState.Unlock
}

// takeHostLock waits for the host-wide file lock and returns the file holding it.
func takeHostLock(tb testing.TB) (*os.File, error) {
	tb.Helper()
	p := hostLockPath()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("host-wide cluster lock %s: %w", p, err)
	}
	if d := time.Since(t0); d > time.Second {
		tb.Logf("kubeenv: waited %v for another test process's clusters on this host to finish", d.Round(time.Millisecond))
	}
	return f, nil
}

// SysctlsBefore returns the kubelet-touched sysctls as they were before the
// cluster started (keys like "vm/overcommit_memory").
func (c *Cluster) SysctlsBefore() map[string]string {
	m := map[string]string{}
	for k, v := range c.host.sysctls {
		m[k] = v
	}
	return m
}

// nodeIP is the address of the interface of the default route: the node's
// InternalIP (kubelet refuses loopback). Nothing is sent anywhere.
func nodeIP() (string, error) {
	out, err := exec.Command("ip", "-4", "route", "get", "192.0.2.255").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("kubeenv: node address: ip route get: %v: %s", err, out)
	}
	f := strings.Fields(string(out))
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "src" {
			return f[i+1], nil
		}
	}
	return "", fmt.Errorf("kubeenv: node address: no src in %q", out)
}

// sharedMount makes dir a mount point of its own in a shared peer group.
func sharedMount(dir string) error {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return err
	}
	if err := syscall.Mount(dir, dir, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("kubeenv: bind %s: %w", dir, err)
	}
	if err := syscall.Mount("", dir, "", syscall.MS_SHARED, ""); err != nil {
		return fmt.Errorf("kubeenv: make-shared %s: %w", dir, err)
	}
	return nil
}

// ImportImage imports a docker-archive into the node's containerd.
func (c *Cluster) ImportImage(path string) error {
	if err := c.Containerd.ImportImage(path); err != nil {
		return fmt.Errorf("kubeenv: %w", err)
	}
	return nil
}

func (c *Cluster) startControlPlane() error {
	p, err := newPKI(filepath.Join(c.Dir, "pki"))
	if err != nil {
		return err
	}
	c.pki = p
	if err := apiserverCerts(p, c.NodeIP); err != nil {
		return err
	}
	lo := []net.IP{net.ParseIP("127.0.0.1")}
	if err := p.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, false, nil, nil); err != nil {
		return err
	}
	for _, x := range []struct {
		name, cn string
		orgs     []string
		server   bool
		ips      []net.IP
		dns      []string
	}{
		{"node", "system:node:" + c.NodeName, []string{"system:nodes"}, false, nil, nil},
		{"kubelet-serving", c.NodeName, nil, true, append(lo, net.ParseIP(c.NodeIP)), []string{c.NodeName}},
	} {
		if c.NodeName == "" {
			break // a control plane only: nodes get theirs as they join
		}
		if err := p.issue(x.name, x.cn, x.orgs, x.server, x.ips, x.dns); err != nil {
			return err
		}
	}
	apiPort, err := netenv.FreePort()
	c.apiPort = apiPort
	if err != nil {
		return err
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	if err := p.kubeconfig(c.Kubeconfig, server, "admin"); err != nil {
		return err
	}
	if c.NodeName != "" {
		if err := p.kubeconfig(filepath.Join(c.Dir, "kubelet.kubeconfig"), server, "node"); err != nil {
			return err
		}
	}
	etcdURL, err := c.startEtcd(filepath.Join(c.Dir, "etcd"))
	if err != nil {
		return err
	}
	c.EtcdURL = etcdURL
	args := apiserverArgs(p, etcdURL, c.NodeIP, apiPort, c.opts.serviceCIDRs())
	if c.egress != "" {
		// Nodes of their own: the kubernetes Service's Endpoints and
		// EndpointSlice name this apiserver (the suite's conformance test
		// checks them); kube-proxy leaves the Service to the nodes' relays
		// (relayProxyName).
		args = append(args, "--egress-selector-config-file", c.egress, "--endpoint-reconciler-type", "lease")
	}
	c.apiArgs = append(args,
		"--kubelet-client-certificate", p.path("apiserver-kubelet-client.crt"), "--kubelet-client-key", p.path("apiserver-kubelet-client.key"),
		"--kubelet-certificate-authority", p.path("ca.crt"), "--kubelet-preferred-address-types", "InternalIP",
		"--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
		// Privileged pods admitted, as kubeadm's apiserver does (the e2e tests
		// that need one, e.g. KubeProxy's CLOSE_WAIT timeout, run).
		"--allow-privileged=true")
	if err := c.StartAPIServer(); err != nil {
		return err
	}
	kcm := append([]string{"--kubeconfig", c.Kubeconfig,
		"--authentication-kubeconfig", c.Kubeconfig, "--authorization-kubeconfig", c.Kubeconfig,
		"--service-account-private-key-file", p.path("sa.key"), "--root-ca-file", p.path("ca.crt"),
		"--use-service-account-credentials=false", "--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", "0"},
		c.opts.nodeCIDRArgs()...)
	kcm = append(kcm, "--controllers", Current.controllersFlag(), "--v", "1")
	if err := c.spawn("kube-controller-manager", kcm...); err != nil {
		return err
	}
	if err := c.spawn("kube-scheduler", "--kubeconfig", c.Kubeconfig,
		"--authentication-kubeconfig", c.Kubeconfig, "--authorization-kubeconfig", c.Kubeconfig,
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", "0", "--v", "1"); err != nil {
		return err
	}
	return c.waitControllerManager()
}

// waitControllerManager waits until kube-controller-manager has published the
// cluster's CA to the default namespace (its root-ca-certificate-publisher
// controller: the first thing it does once its controllers run), failing at
// once with its log if it exits. It serves no health port here
// (--secure-port 0), and a controller manager that refused its flags would
// otherwise show only as a DaemonSet that never gets pods, minutes later.
func (c *Cluster) waitControllerManager() error {
	deadline := time.Now().Add(c.opts.StartTimeout)
	for {
		if err := c.procErr("kube-controller-manager"); err != nil {
			return err
		}
		if _, err := c.Kubectl("get", "configmap", "-n", "default", "kube-root-ca.crt", "-o", "name"); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("kubeenv: kube-controller-manager runs but published no kube-root-ca.crt in %v: %v\n%s", c.opts.StartTimeout, err, c.Log("kube-controller-manager", 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (c *Cluster) startKubelet() error {
	port, err := netenv.FreePort()
	if err != nil {
		return err
	}
	hz, err := netenv.FreePort()
	if err != nil {
		return err
	}
	pki := filepath.Join(c.Dir, "pki")
	root := filepath.Join(c.Dir, "kubelet")
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]s
port: %[2]d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %[3]d
tlsCertFile: %[4]s/kubelet-serving.crt
tlsPrivateKeyFile: %[4]s/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[4]s/ca.crt}
authorization: {mode: Webhook}
# The host is cgroup v1 and containerd uses cgroupfs (SystemdCgroup=false).
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: %[5]s
failSwapOn: false
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
podLogsDir: %[6]s/pod-logs
# A test node on a shared disk: never evict or collect images.
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 250
kubeAPIQPS: 100
kubeAPIBurst: 200
`, c.NodeIP, port, hz, pki, c.Containerd.Endpoint(), c.Dir)
	cfgPath := filepath.Join(c.Dir, "kubelet.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	if err := c.spawn("kubelet", "--config", cfgPath, "--kubeconfig", filepath.Join(c.Dir, "kubelet.kubeconfig"),
		"--root-dir", root, "--cert-dir", filepath.Join(root, "pki"), "--hostname-override", c.NodeName,
		"--node-ip", c.NodeIP, "--v", "1"); err != nil {
		return err
	}
	deadline := time.Now().Add(c.opts.StartTimeout)
	for time.Now().Before(deadline) {
		if err := c.procErr("kubelet"); err != nil {
			return err
		}
		if _, err := c.Kubectl("get", "node", c.NodeName); err == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("kubeenv: node %s not registered after %v", c.NodeName, c.opts.StartTimeout)
}

// StopAPIServer stops the kube-apiserver by PID (SIGTERM); etcd keeps the
// cluster's state, and every client (kubelets, agents, controllers) sees the API
// down until StartAPIServer.
func (c *Cluster) StopAPIServer() { c.stopProc("kube-apiserver") }

// APIServerPID is the running kube-apiserver's process ID (0 before it starts).
func (c *Cluster) APIServerPID() int { return c.pid("kube-apiserver") }

// StartAPIServer starts the kube-apiserver with the arguments it was first
// started with, on the same port and etcd, and waits until it answers.
func (c *Cluster) StartAPIServer() error {
	if err := c.spawn("kube-apiserver", c.apiArgs...); err != nil {
		return err
	}
	return c.waitAPI()
}

func (c *Cluster) waitAPI() error {
	deadline := time.Now().Add(c.opts.StartTimeout)
	var last error
	for time.Now().Before(deadline) {
		if err := c.procErr("kube-apiserver"); err != nil {
			return err
		}
		out, err := c.Kubectl("get", "--raw", "/readyz")
		if err == nil && strings.TrimSpace(out) == "ok" {
			return nil
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("kubeenv: kube-apiserver not ready after %v: %v", c.opts.StartTimeout, last)
}

// Kubectl runs kubectl against the cluster as admin and returns its stdout;
// the error carries stderr.
func (c *Cluster) Kubectl(args ...string) (string, error) {
	return c.KubectlIn(nil, args...)
}

// KubectlIn is Kubectl with stdin.
func (c *Cluster) KubectlIn(stdin []byte, args ...string) (string, error) {
	return kubectl(c.Bin, c.Kubeconfig, stdin, args...)
}

// kubectl runs bin/kubectl with kubeconfig (2 minutes at most).
func kubectl(bin, kubeconfig string, stdin []byte, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// MustKubectl is Kubectl failing the test on error.
func (c *Cluster) MustKubectl(tb testing.TB, args ...string) string {
	tb.Helper()
	out, err := c.Kubectl(args...)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// Apply applies a manifest.
func (c *Cluster) Apply(tb testing.TB, manifest string) {
	tb.Helper()
	if out, err := c.KubectlIn([]byte(manifest), "apply", "-f", "-"); err != nil {
		tb.Fatalf("%v\n%s", err, out)
	}
}

// GetJSON runs kubectl get ... -o json and decodes the result into v.
func (c *Cluster) GetJSON(v any, args ...string) error {
	out, err := c.Kubectl(append(append([]string{"get"}, args...), "-o", "json")...)
	if err != nil {
		return err
	}
	return json.Unmarshal([]byte(out), v)
}

// Pod is the part of a pod the tests read.
type Pod struct {
	Metadata struct {
		Name              string            `json:"name"`
		Namespace         string            `json:"namespace"`
		UID               string            `json:"uid"`
		Labels            map[string]string `json:"labels"`
		CreationTimestamp time.Time         `json:"creationTimestamp"`
		DeletionTimestamp *time.Time        `json:"deletionTimestamp"`
	} `json:"metadata"`
	Status struct {
		Phase  string `json:"phase"`
		PodIP  string `json:"podIP"`
		PodIPs []struct {
			IP string `json:"ip"`
		} `json:"podIPs"`
		Conditions []struct {
			Type               string    `json:"type"`
			Status             string    `json:"status"`
			Reason             string    `json:"reason"`
			Message            string    `json:"message"`
			LastTransitionTime time.Time `json:"lastTransitionTime"`
		} `json:"conditions"`
		ContainerStatuses []struct {
			RestartCount int `json:"restartCount"`
			State        struct {
				Running *struct {
					StartedAt time.Time `json:"startedAt"`
				} `json:"running"`
			} `json:"state"`
		} `json:"containerStatuses"`
	} `json:"status"`
}

// Ready reports whether the pod runs, is not being deleted and is Ready.
func (p Pod) Ready() bool {
	if p.Status.Phase != "Running" || p.Metadata.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

// Pods lists the pods matching a label selector in a namespace.
func (c *Cluster) Pods(namespace, selector string) ([]Pod, error) {
	var l struct {
		Items []Pod `json:"items"`
	}
	args := []string{"pods", "-n", namespace}
	if selector != "" {
		args = append(args, "-l", selector)
	}
	if err := c.GetJSON(&l, args...); err != nil {
		return nil, err
	}
	return l.Items, nil
}

// WaitFor polls cond every interval until it returns true or timeout passes;
// the last error cond returned is in the failure.
func WaitFor(timeout, interval time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			if last == nil {
				last = errors.New("condition not met")
			}
			return fmt.Errorf("after %v: %w", timeout, last)
		}
		time.Sleep(interval)
	}
}

// Log returns the tail of a component's log (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kubelet).
func (c *Cluster) Log(name string, n int) string {
	return logTail(filepath.Join(c.Dir, "logs", name+".log"), n)
}

func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return tail(string(b), n)
}

func (c *Cluster) dumpLogs() {
	for _, n := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"} {
		if s := c.Log(n, 25); s != "" {
			c.tb.Logf("---- %s log, last lines:\n%s", n, s)
		}
	}
	if c.Containerd != nil {
		c.tb.Logf("---- containerd log, last lines:\n%s", c.Containerd.LogTail(25))
	}
}

// cleanup stops the kubelet and the control plane by PID, removes the
// sandboxes left (CNI DEL through the runtime), and undoes the kubelet's host
// changes.
func (c *Cluster) cleanup() {
	tb := c.tb
	if tb.Failed() {
		c.dumpLogs()
	}
	for _, n := range []string{"kubelet", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"} {
		c.stopProc(n)
	}
	if c.Containerd != nil {
		c.Containerd.RemoveSandboxes()
	}
	did, errs := c.host.restore(c.Dir)
	for _, d := range did {
		tb.Logf("kubeenv cleanup: %s", d)
	}
	for _, e := range errs {
		tb.Errorf("kubeenv cleanup: %v", e)
	}
	if c.Containerd == nil {
		c.removeDir() // a control plane without a node's containerd
	}
}

// removeDir unmounts what is mounted under the cluster's directory and removes
// it.
func (c *Cluster) removeDir() {
	if err := unmountUnder(c.Dir); err != nil {
		c.tb.Errorf("kubeenv cleanup: %v", err)
	}
	if err := os.RemoveAll(c.Dir); err != nil {
		c.tb.Errorf("kubeenv cleanup: %v", err)
	}
}
