// Package netconf holds the node-network settings of ipledgerd (routes to the other
// nodes' pods, masquerade of pod traffic leaving the cluster): their flags and the
// checks that refuse a bad value with the flag and the fix, and the node's address
// (--node-ip, or the one of its default route). They apply when the agent knows the
// other nodes: from the Kubernetes Nodes (clusterconf.Config.Kubernetes), or from
// the node leases of the etcd datastore, published with each node's address.
package netconf

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
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
	// NodeIPs (--node-ip): the node's addresses, at most one per family, published
	// with its lease in cluster mode (the other nodes route its blocks through
	// them). None given: DefaultNodeIPs.
	NodeIPs []netip.Addr

	set map[string]bool
}

// Register adds the flags to fs.
func (c *Config) Register(fs *flag.FlagSet) {
	fs.BoolVar(&c.Routes, "routes", true, "with --node-name or --datastore etcd: route every other node's pod CIDRs (cluster mode: its blocks) via its InternalIP, in the main table under ipledger's route protocol; false when the underlay (a cloud route table) routes pod addresses")
	fs.BoolVar(&c.Masquerade, "masquerade", true, "with --node-name or --datastore etcd: masquerade pod traffic to destinations outside every pod range of the cluster (and outside --non-masquerade-cidrs) to the node's address")
	fs.Func("non-masquerade-cidrs", "with --node-name or --datastore etcd: comma-separated CIDRs that pods reach with their own address, besides the cluster's pod ranges (e.g. a VPC's range, as ip-masq-agent's nonMasqueradeCIDRs)", func(s string) error {
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
	fs.Func("node-ip", "cluster mode: this node's address(es) on the network the nodes share, IPv4 and/or IPv6, comma-separated, published with the node lease; with --datastore etcd the other nodes route this node's blocks through them (default: the source address of the default route of each family)", func(s string) error {
		ips, err := ParseNodeIPs(s)
		c.NodeIPs = ips
		return err
	})
	fs.DurationVar(&c.Resync, "node-network-resync", DefaultResync, "with --node-name or --datastore etcd: how often routes and masquerade rules are compared with the desired state when nothing changed (a route deleted behind ipledger's back comes back within it)")
}

// Check refuses a bad setting, naming the flag and the fix. nodes says whether the
// agent knows the other nodes (its Kubernetes features on, or the etcd datastore's
// node leases); cluster whether it runs in cluster mode (a node lease to publish
// --node-ip with); fs is the parsed flag set c was registered on.
func (c *Config) Check(fs *flag.FlagSet, nodes, cluster bool) error {
	c.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { c.set[f.Name] = true })
	if c.set["node-ip"] && !cluster {
		return errors.New("--node-ip: published with the node lease of cluster mode; add --datastore etcd (with --node-name), or drop --node-ip")
	}
	if !nodes {
		for _, n := range []string{"routes", "masquerade", "non-masquerade-cidrs", "node-network-resync"} {
			if c.set[n] {
				return fmt.Errorf("--%s: the node network needs the Nodes; add --node-name (node mode), --datastore kubernetes or --datastore etcd, or drop --%s", n, n)
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

// Enabled reports whether there is anything for the node network to do; nodes
// says whether the agent knows the other nodes.
func (c *Config) Enabled(nodes bool) bool { return nodes && (c.Routes || c.Masquerade) }

// ParseNodeIPs reads --node-ip: comma-separated addresses, at most one per family,
// each a unicast address without zone.
func ParseNodeIPs(s string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("%q is not an IP address (want e.g. 10.0.0.11 or fd00::11)", f)
		}
		if a.Is4In6() {
			a = a.Unmap()
		}
		if a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() || a.IsLinkLocalUnicast() {
			return nil, fmt.Errorf("%s: want the node's unicast address on the network the nodes share (not unspecified, multicast, loopback or link-local)", a)
		}
		for _, o := range out {
			if o.Is4() == a.Is4() {
				return nil, fmt.Errorf("%s and %s: at most one address per family", o, a)
			}
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, errors.New("no address given (want e.g. 10.0.0.11 or 10.0.0.11,fd00::11)")
	}
	return out, nil
}

// Probes are the destinations whose routes DefaultNodeIPs asks the kernel for:
// documentation addresses (RFC 5737, RFC 3849), routed by the default route.
var Probes = []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")}

// RouteGetter is the part of a netlink handle DefaultNodeIPs needs.
type RouteGetter interface {
	RouteGet(dst net.IP) ([]netlink.Route, error)
	AddrList(link netlink.Link, family int) ([]netlink.Addr, error)
	LinkByIndex(index int) (netlink.Link, error)
}

var _ RouteGetter = (*netlink.Handle)(nil)

// DefaultNodeIPs returns the node's address of each family that has a route to
// the Probes (the default route): the source address the kernel would use, else
// the first global address of that route's interface. Nothing is sent. A family
// without such a route has no address; none at all is an error naming why.
func DefaultNodeIPs(h RouteGetter) ([]netip.Addr, error) {
	var out []netip.Addr
	var errs []error
	for _, p := range Probes {
		a, err := sourceFor(h, p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no default route with a source address (give --node-ip): %w", errors.Join(errs...))
	}
	return out, nil
}

func sourceFor(h RouteGetter, dst netip.Addr) (netip.Addr, error) {
	rs, err := h.RouteGet(dst.AsSlice())
	if err != nil {
		return netip.Addr{}, fmt.Errorf("route to %s: %w", dst, err)
	}
	for _, r := range rs {
		if a, ok := netip.AddrFromSlice(r.Src); ok && a.Unmap().Is4() == dst.Is4() && a.IsGlobalUnicast() {
			return a.Unmap(), nil
		}
		if r.LinkIndex <= 0 {
			continue
		}
		link, err := h.LinkByIndex(r.LinkIndex)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("route to %s: its interface: %w", dst, err)
		}
		fam := netlink.FAMILY_V6
		if dst.Is4() {
			fam = netlink.FAMILY_V4
		}
		addrs, err := h.AddrList(link, fam)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("route to %s: addresses of %s: %w", dst, link.Attrs().Name, err)
		}
		for _, ad := range addrs {
			if a, ok := netip.AddrFromSlice(ad.IP); ok && a.IsGlobalUnicast() {
				return a.Unmap(), nil
			}
		}
	}
	return netip.Addr{}, fmt.Errorf("route to %s: no source address", dst)
}
