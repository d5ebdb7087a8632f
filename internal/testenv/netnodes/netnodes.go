// Package netnodes builds several cluster nodes on one machine for tests of the
// node network, out of network namespaces only: the host's own interfaces,
// routes and netfilter rules are never part of it.
//
//	L2 namespace:  bridge br0 (the nodes' shared L2 network, 10.250.0.0/24 and fd00:250::/64)
//	               ├─ veth ── node 0 namespace: eth0 10.250.0.11, fd00:250::11; forwarding on
//	               ├─ veth ── node 1 namespace: eth0 10.250.0.12, fd00:250::12
//	               ├─ …
//	               └─ veth ── outside namespace: eth0 10.250.0.254, fd00:250::fe
//	                          (the world outside the cluster; each node's default route)
//	AddPod:        pod namespace ── veth ── a node namespace, wired as ipledger-veth
//	               wires a pod: /32 (/128) host route on the node side, proxy_arp,
//	               default route in the pod via 169.254.1.1 / fe80::1.
//
// The outside namespace routes nothing: it can answer only addresses of the L2
// network, so a pod reaches it only when its node masquerades. Namespaces are
// named ipl-nn<PID>-<seq>-<role> under /run/netns (so `ip netns exec` works while a
// test runs) and removed by t.Cleanup; New also removes those a killed test
// process left behind (their PID gone).
package netnodes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/netenv"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ipledger/ipledger/internal/nsenter"
)

// The L2 network of the nodes. Never routed off the machine: it exists only
// inside the environment's namespaces.
var (
	L2V4      = netip.MustParsePrefix("10.250.0.0/24")
	L2V6      = netip.MustParsePrefix("fd00:250::/64")
	OutsideV4 = netip.MustParseAddr("10.250.0.254")
	OutsideV6 = netip.MustParseAddr("fd00:250::fe")
)

// Pod gateways, as ipledger-veth sets them: the node side answers for
// GatewayV4 (a permanent neighbour entry in the pod, proxy_arp on the node) and
// carries GatewayV6 as an address.
var (
	GatewayV4 = netip.MustParseAddr("169.254.1.1")
	GatewayV6 = netip.MustParseAddr("fe80::1")
)

// netnsDir is where named namespaces are bind-mounted (as by `ip netns add`).
const netnsDir = "/run/netns"

// namePrefix starts every namespace name of this package.
const namePrefix = "ipl-nn"

var seq atomic.Int64

// NS is a network namespace of the environment.
type NS struct {
	// Netns is the namespace's name under /run/netns (for `ip -n`, `ip netns
	// exec`).
	Netns string
	// Handle is an open descriptor of the namespace (for nftables.WithNetNSFd,
	// nsenter.Handle).
	Handle netns.NsHandle
	// Netlink is a netlink handle inside the namespace.
	Netlink *netlink.Handle
}

// Host is a namespace with an address on the L2 network: a node, or outside.
type Host struct {
	*NS
	// Name is "node0", "node1", …, or "outside".
	Name string
	// Addr4 and Addr6 are the host's addresses on the L2 network (on Link).
	Addr4, Addr6 netip.Addr
	// Link is the interface on the L2 network ("eth0").
	Link string
}

// Addrs is the host's L2 addresses, IPv4 first (a Node's InternalIPs).
func (h *Host) Addrs() []netip.Addr { return []netip.Addr{h.Addr4, h.Addr6} }

// Pod is a pod namespace behind a node.
type Pod struct {
	*NS
	Name  string
	Node  *Host
	Addrs []netip.Addr
	// HostLink is the node-side veth; the pod side is "eth0".
	HostLink string
}

// Env is the nodes, the bridge between them and the outside.
type Env struct {
	tb     testing.TB
	prefix string
	// L2 holds the bridge br0.
	L2 *NS
	// Nodes are node0 … node(N-1), with addresses .11, .12, … on the L2 network.
	Nodes []*Host
	// Outside is the world outside the cluster, on the same L2 network.
	Outside *Host
}

// New builds the environment with n nodes; every part is removed by
// tb.Cleanup. It fails the test on any error.
func New(tb testing.TB, n int) *Env {
	tb.Helper()
	if n < 1 || n > 200 {
		tb.Fatalf("netnodes: %d nodes (1..200)", n)
	}
	sweepLeftovers(tb)
	e := &Env{tb: tb, prefix: fmt.Sprintf("%s%d-%d-", namePrefix, os.Getpid(), seq.Add(1))}
	e.L2 = e.newNS("l2")
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := e.L2.Netlink.LinkAdd(br); err != nil {
		tb.Fatalf("netnodes: bridge: %v", err)
	}
	if err := e.L2.Netlink.LinkSetUp(br); err != nil {
		tb.Fatalf("netnodes: bridge up: %v", err)
	}
	for i := range n {
		h := e.newHost(fmt.Sprintf("node%d", i), fmt.Sprintf("n%d", i),
			netip.AddrFrom4([4]byte{10, 250, 0, byte(11 + i)}),
			netip.MustParseAddr(fmt.Sprintf("fd00:250::%d", 11+i)))
		e.setSysctls(h.NS, map[string]string{"ipv4/ip_forward": "1", "ipv6/conf/all/forwarding": "1"})
		e.Nodes = append(e.Nodes, h)
	}
	e.Outside = e.newHost("outside", "out", OutsideV4, OutsideV6)
	for _, h := range e.Nodes {
		e.addDefaultRoutes(h)
	}
	return e
}

// Node returns node i.
func (e *Env) Node(i int) *Host { return e.Nodes[i] }

// AddPod makes a pod namespace behind node, wired as ipledger-veth wires one:
// a veth with "eth0" in the pod holding addrs as /32 (/128) addresses and a
// default route per family through the link-local gateways, and on the node
// side (named "v"+name) proxy_arp, fe80::1, and a host route per address.
func (e *Env) AddPod(node *Host, name string, addrs ...netip.Addr) *Pod {
	e.tb.Helper()
	hostLink := "v" + name
	if len(hostLink) > unix.IFNAMSIZ-1 {
		e.tb.Fatalf("netnodes: pod name %q too long for an interface name", name)
	}
	p := &Pod{NS: e.newNS("p-" + name), Name: name, Node: node, Addrs: addrs, HostLink: hostLink}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: hostLink},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(p.Handle)),
	}
	if err := node.Netlink.LinkAdd(veth); err != nil {
		e.tb.Fatalf("netnodes: veth %s of pod %s: %v", hostLink, name, err)
	}
	host, err := node.Netlink.LinkByName(hostLink)
	if err != nil {
		e.tb.Fatalf("netnodes: %v", err)
	}
	e.setSysctls(node.NS, map[string]string{
		"ipv4/conf/" + hostLink + "/proxy_arp":  "1",
		"ipv4/conf/" + hostLink + "/forwarding": "1",
		"ipv6/conf/" + hostLink + "/forwarding": "1",
	})
	must(e.tb, "node side up", node.Netlink.LinkSetUp(host))
	gw6 := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(GatewayV6, 64)), Flags: unix.IFA_F_NODAD, Scope: unix.RT_SCOPE_LINK}
	must(e.tb, "node side fe80::1", node.Netlink.AddrAdd(host, gw6))
	for _, a := range addrs {
		r := &netlink.Route{LinkIndex: host.Attrs().Index, Dst: ipNet(netip.PrefixFrom(a, a.BitLen()))}
		if a.Is4() {
			r.Scope = netlink.SCOPE_LINK
		}
		must(e.tb, "host route to "+a.String(), node.Netlink.RouteAdd(r))
	}

	ph := p.Netlink
	lo, err := ph.LinkByName("lo")
	if err != nil {
		e.tb.Fatalf("netnodes: pod lo: %v", err)
	}
	must(e.tb, "pod lo up", ph.LinkSetUp(lo))
	eth, err := ph.LinkByName("eth0")
	if err != nil {
		e.tb.Fatalf("netnodes: pod eth0: %v", err)
	}
	for _, a := range addrs {
		must(e.tb, "pod address "+a.String(), ph.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(a, a.BitLen())), Flags: unix.IFA_F_NODAD}))
	}
	must(e.tb, "pod eth0 up", ph.LinkSetUp(eth))
	idx := eth.Attrs().Index
	for _, fam := range []struct {
		v4  bool
		gw  netip.Addr
		nlf int
	}{{true, GatewayV4, netlink.FAMILY_V4}, {false, GatewayV6, netlink.FAMILY_V6}} {
		var src netip.Addr
		for _, a := range addrs {
			if a.Is4() == fam.v4 {
				src = a
				break
			}
		}
		if !src.IsValid() {
			continue
		}
		must(e.tb, "pod neighbour "+fam.gw.String(), ph.NeighSet(&netlink.Neigh{
			LinkIndex: idx, Family: fam.nlf, State: netlink.NUD_PERMANENT,
			IP: fam.gw.AsSlice(), HardwareAddr: host.Attrs().HardwareAddr,
		}))
		if fam.v4 {
			must(e.tb, "pod gateway route", ph.RouteAdd(&netlink.Route{
				LinkIndex: idx, Dst: ipNet(netip.PrefixFrom(fam.gw, 32)), Scope: netlink.SCOPE_LINK, Src: src.AsSlice(),
			}))
		}
		must(e.tb, "pod default route", ph.RouteAdd(&netlink.Route{
			LinkIndex: idx, Dst: ipNet(netip.PrefixFrom(fam.gw, 0).Masked()), Gw: fam.gw.AsSlice(),
		}))
	}
	return p
}

// Namespace makes an empty namespace of the environment (its loopback up), for a
// pod a CNI plugin wires, removed by tb.Cleanup like the rest. role names it
// (ipl-nn<PID>-<seq>-<role>).
func (e *Env) Namespace(role string) *NS {
	e.tb.Helper()
	ns := e.newNS(role)
	lo, err := ns.Netlink.LinkByName("lo")
	if err != nil {
		e.tb.Fatalf("netnodes: %s lo: %v", role, err)
	}
	must(e.tb, role+" lo up", ns.Netlink.LinkSetUp(lo))
	return ns
}

// newHost makes a namespace attached to the bridge by a veth (bridgeSide in the
// L2 namespace, eth0 in the host's) with a4/24 and a6/64.
func (e *Env) newHost(name, bridgeSide string, a4, a6 netip.Addr) *Host {
	e.tb.Helper()
	h := &Host{NS: e.newNS(name), Name: name, Addr4: a4, Addr6: a6, Link: "eth0"}
	br, err := e.L2.Netlink.LinkByName("br0")
	if err != nil {
		e.tb.Fatalf("netnodes: %v", err)
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: bridgeSide, MasterIndex: br.Attrs().Index},
		PeerName:      h.Link,
		PeerNamespace: netlink.NsFd(int(h.Handle)),
	}
	if err := e.L2.Netlink.LinkAdd(veth); err != nil {
		e.tb.Fatalf("netnodes: veth of %s: %v", name, err)
	}
	side, err := e.L2.Netlink.LinkByName(bridgeSide)
	if err != nil {
		e.tb.Fatalf("netnodes: %v", err)
	}
	must(e.tb, "bridge port up", e.L2.Netlink.LinkSetUp(side))
	lo, err := h.Netlink.LinkByName("lo")
	if err != nil {
		e.tb.Fatalf("netnodes: %s lo: %v", name, err)
	}
	must(e.tb, name+" lo up", h.Netlink.LinkSetUp(lo))
	eth, err := h.Netlink.LinkByName(h.Link)
	if err != nil {
		e.tb.Fatalf("netnodes: %s %s: %v", name, h.Link, err)
	}
	must(e.tb, name+" v4 address", h.Netlink.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(a4, L2V4.Bits()))}))
	must(e.tb, name+" v6 address", h.Netlink.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(a6, L2V6.Bits())), Flags: unix.IFA_F_NODAD}))
	must(e.tb, name+" up", h.Netlink.LinkSetUp(eth))
	return h
}

// addDefaultRoutes routes h's traffic for the rest of the world to outside.
func (e *Env) addDefaultRoutes(h *Host) {
	e.tb.Helper()
	eth, err := h.Netlink.LinkByName(h.Link)
	if err != nil {
		e.tb.Fatalf("netnodes: %v", err)
	}
	for _, gw := range []netip.Addr{OutsideV4, OutsideV6} {
		r := &netlink.Route{LinkIndex: eth.Attrs().Index, Dst: ipNet(netip.PrefixFrom(gw, 0).Masked()), Gw: gw.AsSlice()}
		must(e.tb, h.Name+" default route via "+gw.String(), h.Netlink.RouteAdd(r))
	}
}

// newNS creates the namespace prefix+role (netenv.Create), with a netlink handle
// in it and IPv6 duplicate address detection off (addresses are usable at once).
func (e *Env) newNS(role string) *NS {
	e.tb.Helper()
	name := e.prefix + role
	_, h := netenv.Create(e.tb, name)
	ns := &NS{Netns: name, Handle: h}
	e.tb.Cleanup(func() { // before netenv's removal of the namespace
		if ns.Netlink != nil {
			ns.Netlink.Close()
		}
		ns.Handle.Close()
	})
	nl, err := nsenter.Handle(int(h))
	if err != nil {
		e.tb.Fatalf("netnodes: netlink in %s: %v", name, err)
	}
	ns.Netlink = nl
	e.setSysctls(ns, map[string]string{"ipv6/conf/all/accept_dad": "0", "ipv6/conf/default/accept_dad": "0"})
	return ns
}

// setSysctls writes /proc/sys/net/KEY=VALUE inside ns.
func (e *Env) setSysctls(ns *NS, kv map[string]string) {
	e.tb.Helper()
	err := ns.Do(func() error {
		for k, v := range kv {
			if err := os.WriteFile(filepath.Join("/proc/sys/net", k), []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		e.tb.Fatalf("netnodes: sysctl in %s: %v", ns.Netns, err)
	}
}

// Do runs fn on an OS thread inside the namespace. Sockets fn opens stay in
// the namespace after it returns. The thread returns to its own namespace
// afterwards; if it cannot, it is never reused (it ends with its goroutine).
func (n *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("current namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(n.Handle); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter %s: %w", n.Netns, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Stay locked: the thread exits with this goroutine.
			errc <- errors.Join(ferr, fmt.Errorf("leave %s: %w", n.Netns, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Listen opens a listener inside the namespace.
func (n *NS) Listen(network, address string) (net.Listener, error) {
	var ln net.Listener
	err := n.Do(func() error {
		var err error
		ln, err = net.Listen(network, address)
		return err
	})
	return ln, err
}

// Dial connects from inside the namespace, within timeout.
func (n *NS) Dial(network, address string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// Dump is the namespace's addresses and routes as `ip` shows them, for test
// logs; empty when iproute2 is missing.
func (n *NS) Dump() string {
	var b strings.Builder
	for _, args := range [][]string{{"-br", "addr"}, {"route"}, {"-6", "route"}} {
		out, err := exec.Command("ip", append([]string{"-n", n.Netns}, args...)...).CombinedOutput()
		if err != nil && len(out) == 0 {
			return b.String()
		}
		fmt.Fprintf(&b, "# ip -n %s %s\n%s", n.Netns, strings.Join(args, " "), out)
	}
	return b.String()
}

var leftover = regexp.MustCompile(`^` + namePrefix + `(\d+)-`)

// sweepLeftovers removes the namespaces of this package whose creating process
// is gone (a test killed before its cleanup ran).
func sweepLeftovers(tb testing.TB) {
	entries, err := os.ReadDir(netnsDir)
	if err != nil {
		return
	}
	for _, ent := range entries {
		m := leftover.FindStringSubmatch(ent.Name())
		if m == nil {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || pid == os.Getpid() || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			continue // alive (or not ours to judge)
		}
		if err := netenv.Remove(ent.Name()); err != nil {
			tb.Logf("netnodes: leftover namespace %s: %v", ent.Name(), err)
		}
	}
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func must(tb testing.TB, what string, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatalf("netnodes: %s: %v", what, err)
	}
}
