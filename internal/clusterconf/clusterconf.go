// Package clusterconf holds the cluster-mode settings of ipledgerd (which datastore,
// its credentials, this node's name, the lease and block timings): their flags, the
// checks that refuse a bad combination with the flag and the fix, and the constructor
// of the datastore they describe. ipledgerd's main only registers, checks and calls.
package clusterconf

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/datastore/kubeds"
)

// Datastore kinds (--datastore).
const (
	None       = "none"       // node mode: node-local pools, no datastore
	Kubernetes = "kubernetes" // the Kubernetes API (CRDs and coordination.k8s.io Leases)
	Etcd       = "etcd"       // etcd v3
)

// Defaults, chosen together:
//   - DefaultLeaseTTL 20s: the holder renews every TTL/3 (under 7s), so two renewals
//     can fail on a slow datastore before the agent stops allocating; a partitioned or
//     paused agent stops allocating from its blocks within 20s (less its margin).
//   - DefaultQuarantine 60s: a dead node's blocks are reclaimed TTL+quarantine = 80s
//     after its last renewal, within the 90s the design promises, and three lease
//     lengths after expiry, so an agent that was only paused (a long GC, a frozen VM)
//     has had every chance to notice that it lost its lease before its blocks move.
//   - DefaultBlockGrace 5m: an empty block is handed back only after staying empty
//     that long (two observations); pods come and go in bursts (a rollout), and a
//     claim costs datastore writes, so a block is kept through a short lull.
const (
	DefaultLeaseTTL   = 20 * time.Second
	DefaultQuarantine = 60 * time.Second
	DefaultBlockGrace = 5 * time.Minute
	// MinLeaseTTL: etcd refuses shorter leases (its minimum is about 1.5 electionTicks
	// heartbeats, 1.5s with the default settings), and a shorter TTL leaves no room
	// for one renewal's round trip.
	MinLeaseTTL = 2 * time.Second
)

// Config is the cluster-mode part of ipledgerd's flags.
type Config struct {
	Datastore     string // None, Kubernetes or Etcd
	NodeName      string
	EtcdEndpoints []string
	EtcdCert      string // client certificate (PEM), with EtcdKey
	EtcdKey       string
	EtcdCA        string // CA bundle that signed the servers' certificates
	Kubeconfig    string // empty: in-cluster credentials
	KubeNamespace string // namespace of the node Leases
	LeaseTTL      time.Duration
	BlockGrace    time.Duration
	Quarantine    time.Duration

	set map[string]bool // flags given on the command line (Check reads it)
}

// Cluster reports whether the agent runs in cluster mode.
func (c *Config) Cluster() bool { return c.Datastore != None }

// Kubernetes reports whether the agent talks to the Kubernetes API for its Node
// features (usePodCidr, routes between nodes, NetworkUnavailable): with --datastore
// kubernetes, or in node mode with --node-name given (NODE_NAME alone does not turn
// them on: an agent outside Kubernetes may have it set). --datastore etcd keeps the
// cluster's state out of Kubernetes and has no Node objects.
func (c *Config) Kubernetes() bool {
	return c.Datastore == Kubernetes || c.Datastore == None && c.set["node-name"]
}

// LeaseNodes reports whether the agent learns the other nodes, and their addresses,
// from the node leases in the datastore rather than from Kubernetes Nodes: with
// --datastore etcd, which has no Node objects.
func (c *Config) LeaseNodes() bool { return c.Datastore == Etcd }

// Register adds the cluster-mode flags to fs. getenv supplies NODE_NAME, the default
// of --node-name (the DaemonSet sets it from the pod's spec.nodeName).
func (c *Config) Register(fs *flag.FlagSet, getenv func(string) string) {
	fs.StringVar(&c.Datastore, "datastore", None, "cluster mode: where the cluster-wide pools live: kubernetes (the Kubernetes API), etcd, or none (node-local pools)")
	fs.StringVar(&c.NodeName, "node-name", getenv("NODE_NAME"), "this node's Kubernetes name (default $NODE_NAME): cluster mode's owner of address blocks; in node mode, given on the command line, it turns on the Kubernetes features (usePodCidr ranges, routes to the other nodes' pods, NetworkUnavailable)")
	fs.Func("etcd-endpoints", "cluster mode with --datastore etcd: comma-separated etcd client URLs, e.g. https://10.0.0.1:2379,https://10.0.0.2:2379", func(s string) error {
		c.EtcdEndpoints = nil
		for _, e := range strings.Split(s, ",") {
			if e = strings.TrimSpace(e); e != "" {
				c.EtcdEndpoints = append(c.EtcdEndpoints, e)
			}
		}
		return nil
	})
	fs.StringVar(&c.EtcdCert, "etcd-cert", "", "--datastore etcd: client certificate file (PEM), with --etcd-key")
	fs.StringVar(&c.EtcdKey, "etcd-key", "", "--datastore etcd: client key file (PEM), with --etcd-cert")
	fs.StringVar(&c.EtcdCA, "etcd-ca", "", "--datastore etcd: CA bundle file (PEM) that verifies the etcd servers")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig file for the Kubernetes API (--datastore kubernetes, or --node-name in node mode); empty: the pod's in-cluster credentials")
	ns := getenv("POD_NAMESPACE")
	if ns == "" {
		ns = kubeds.DefaultNamespace
	}
	fs.StringVar(&c.KubeNamespace, "kube-namespace", ns, "--datastore kubernetes: namespace of the node Leases (default $POD_NAMESPACE, else ipledger)")
	fs.DurationVar(&c.LeaseTTL, "node-lease-ttl", DefaultLeaseTTL, "cluster mode: TTL of this node's lease in the datastore; the agent stops allocating from its blocks when it cannot prove the lease alive")
	fs.DurationVar(&c.BlockGrace, "block-grace", DefaultBlockGrace, "cluster mode: how long a block must stay empty (over two observations) before the node hands it back")
	fs.DurationVar(&c.Quarantine, "reclaim-quarantine", DefaultQuarantine, "cluster mode: how long another node's lease must stay expired before its blocks are reclaimed; at least --node-lease-ttl")
}

// Check refuses a bad setting or combination, naming the flag and the fix. fs is the
// parsed flag set c was registered on (it tells which flags were given).
func (c *Config) Check(fs *flag.FlagSet) error {
	c.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { c.set[f.Name] = true })
	var etcdFlags, kubeFlags, clusterFlags []string
	for _, n := range []string{"etcd-endpoints", "etcd-cert", "etcd-key", "etcd-ca"} {
		if c.set[n] {
			etcdFlags = append(etcdFlags, "--"+n)
		}
	}
	for _, n := range []string{"kubeconfig", "kube-namespace"} {
		if c.set[n] {
			kubeFlags = append(kubeFlags, "--"+n)
		}
	}
	for _, n := range []string{"node-lease-ttl", "block-grace", "reclaim-quarantine"} {
		if c.set[n] {
			clusterFlags = append(clusterFlags, "--"+n)
		}
	}
	switch c.Datastore {
	case None:
		if given := append(etcdFlags, clusterFlags...); len(given) > 0 {
			return fmt.Errorf("%s: only for cluster mode; add --datastore kubernetes or --datastore etcd (with --node-name), or drop %s", given[0], strings.Join(given, " "))
		}
		if c.set["kube-namespace"] {
			return errors.New("--kube-namespace: only for --datastore kubernetes (the namespace of the node Leases); drop it, or add --datastore kubernetes")
		}
		if c.set["kubeconfig"] && !c.set["node-name"] {
			return errors.New("--kubeconfig: the Kubernetes features of node mode need this node's name; add --node-name NAME, or drop --kubeconfig")
		}
		if !c.set["node-name"] {
			return nil
		}
		if err := checkName(c.NodeName); err != nil {
			return fmt.Errorf("--node-name %q: %v; use the node's Kubernetes name", c.NodeName, err)
		}
		return nil
	case Etcd:
		if len(kubeFlags) > 0 {
			return fmt.Errorf("%s: only for --datastore kubernetes; drop it, or use --datastore kubernetes", kubeFlags[0])
		}
		if len(c.EtcdEndpoints) == 0 {
			return errors.New("--datastore etcd: needs --etcd-endpoints URL[,URL...], the etcd cluster's client URLs")
		}
		for _, e := range c.EtcdEndpoints {
			if !strings.HasPrefix(e, "http://") && !strings.HasPrefix(e, "https://") {
				return fmt.Errorf("--etcd-endpoints: %q is not a URL; write it as https://HOST:PORT (or http:// without TLS)", e)
			}
		}
		if (c.EtcdCert == "") != (c.EtcdKey == "") {
			return errors.New("--etcd-cert and --etcd-key: give both (the client certificate and its key) or neither")
		}
	case Kubernetes:
		if len(etcdFlags) > 0 {
			return fmt.Errorf("%s: only for --datastore etcd; drop %s, or use --datastore etcd", etcdFlags[0], strings.Join(etcdFlags, " "))
		}
	default:
		return fmt.Errorf("--datastore %q: use kubernetes, etcd or none", c.Datastore)
	}
	if c.NodeName == "" {
		return fmt.Errorf("--node-name: cluster mode (--datastore %s) needs this node's name; pass --node-name or set NODE_NAME (the DaemonSet sets it from spec.nodeName)", c.Datastore)
	}
	if err := checkName(c.NodeName); err != nil {
		return fmt.Errorf("--node-name %q: %v; use the node's Kubernetes name", c.NodeName, err)
	}
	if c.LeaseTTL < MinLeaseTTL {
		return fmt.Errorf("--node-lease-ttl %v: at least %v (etcd refuses shorter leases, and a renewal needs a round trip); raise it", c.LeaseTTL, MinLeaseTTL)
	}
	if c.BlockGrace <= 0 {
		return errors.New("--block-grace: must be positive")
	}
	if c.Quarantine < c.LeaseTTL {
		return fmt.Errorf("--reclaim-quarantine %v is shorter than --node-lease-ttl %v: a node whose lease expired must stay dead at least one lease long before its blocks move (a paused agent needs that long to notice it lost them); raise --reclaim-quarantine", c.Quarantine, c.LeaseTTL)
	}
	return nil
}

// checkName accepts a Kubernetes object name (DNS subdomain): it names the node's
// lease and appears in block records.
func checkName(s string) error {
	if len(s) > datastore.MaxName {
		return fmt.Errorf("longer than %d bytes", datastore.MaxName)
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if (b < 'a' || b > 'z') && (b < '0' || b > '9') && b != '-' && b != '.' {
			return fmt.Errorf("character %q: only lower-case letters, digits, '-' and '.'", b)
		}
	}
	alnum := func(b byte) bool { return (b >= 'a' && b <= 'z') || (b >= '0' && b <= '9') }
	if !alnum(s[0]) || !alnum(s[len(s)-1]) {
		return errors.New("must start and end with a letter or digit")
	}
	return nil
}
