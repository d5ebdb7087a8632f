// Package netconf holds the node-network settings of ipledgerd (routes to the other
// nodes' pods, masquerade of pod traffic leaving the cluster): their flags and the
// checks that refuse a bad value with the flag and the fix. They apply when the agent
// has its Kubernetes features on (clusterconf.Config.Kubernetes): the Nodes say where
// every node's pods are.
package netconf

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// DefaultResync is how often the routes and rules are compared with the desired
// state even when no Node changed: a route another program deleted (systemd-networkd
// flushing foreign routes, an operator) comes back within it.
const DefaultResync = 30 * time.Second

// Config is the node-network part of ipledgerd's flags.
type Config struct {
	// Routes: program routes to every other node's pod CIDRs (cluster mode: blocks)
	// via its InternalIP. Off when the underlay routes pod addresses itself.
	Routes bool
	// Masquerade: SNAT pod traffic to destinations outside every pod range of the
	// cluster (and outside NonMasquerade) to the node's address.
	Masquerade    bool
	NonMasquerade []netip.Prefix
	Resync        time.Duration

	set map[string]bool
}

// Register adds the flags to fs.
func (c *Config) Register(fs *flag.FlagSet) {
	fs.BoolVar(&c.Routes, "routes", true, "with --node-name: route every other node's pod CIDRs (cluster mode: its blocks) via its InternalIP, in the main table under ipledger's route protocol; false when the underlay (a cloud route table) routes pod addresses")
	fs.BoolVar(&c.Masquerade, "masquerade", true, "with --node-name: masquerade pod traffic to destinations outside every pod range of the cluster (and outside --non-masquerade-cidrs) to the node's address")
	fs.Func("non-masquerade-cidrs", "with --node-name: comma-separated CIDRs that pods reach with their own address, besides the cluster's pod ranges (e.g. a VPC's range, as ip-masq-agent's nonMasqueradeCIDRs)", func(s string) error {
		c.NonMasquerade = nil
		for _, f := range strings.Split(s, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			p, err := netip.ParsePrefix(f)
			if err != nil {
				return fmt.Errorf("%q is not a CIDR (want e.g. 10.0.0.0/8)", f)
			}
			if p.Masked() != p {
				return fmt.Errorf("%s has host bits set; use %s", p, p.Masked())
			}
			c.NonMasquerade = append(c.NonMasquerade, p)
		}
		return nil
	})
	fs.DurationVar(&c.Resync, "node-network-resync", DefaultResync, "with --node-name: how often routes and masquerade rules are compared with the desired state when nothing changed (a route deleted behind ipledger's back comes back within it)")
}

// Check refuses a bad setting, naming the flag and the fix. kube says whether the
// agent has its Kubernetes features on; fs is the parsed flag set c was registered on.
func (c *Config) Check(fs *flag.FlagSet, kube bool) error {
	c.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { c.set[f.Name] = true })
	if !kube {
		for _, n := range []string{"routes", "masquerade", "non-masquerade-cidrs", "node-network-resync"} {
			if c.set[n] {
				return fmt.Errorf("--%s: the node network needs the Nodes; add --node-name (node mode) or --datastore kubernetes, or drop --%s", n, n)
			}
		}
		return nil
	}
	if c.Resync <= 0 {
		return errors.New("--node-network-resync: must be positive")
	}
	if c.set["non-masquerade-cidrs"] && !c.Masquerade {
		return errors.New("--non-masquerade-cidrs: has no effect with --masquerade=false; drop one of them")
	}
	return nil
}

// Enabled reports whether there is anything for the node network to do.
func (c *Config) Enabled(kube bool) bool { return kube && (c.Routes || c.Masquerade) }
