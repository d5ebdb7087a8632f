package veth

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipledger/ipledger/internal/nodenet/routes"
	"github.com/ipledger/ipledger/internal/nsenter"
)

// Link-local gateways the pod routes through. The host-side veth answers for
// GatewayV4 by proxy ARP (and the pod also gets a permanent neighbour entry for
// it), and carries GatewayV6 as an address.
var (
	GatewayV4 = net.IPv4(169, 254, 1, 1).To4()
	GatewayV6 = net.ParseIP("fe80::1")
)

func hostLen(ip net.IP) int {
	if ip.To4() != nil {
		return 32
	}
	return 128
}

func hostNet(ip net.IP) *net.IPNet {
	if v4 := ip.To4(); v4 != nil {
		ip = v4
	}
	n := hostLen(ip)
	return &net.IPNet{IP: ip, Mask: net.CIDRMask(n, n)}
}

func gatewayFor(ip net.IP) net.IP {
	if ip.To4() != nil {
		return GatewayV4
	}
	return GatewayV6
}

func family(ip net.IP) int {
	if ip.To4() != nil {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

func isNotFound(err error) bool {
	var lnf netlink.LinkNotFoundError
	return errors.As(err, &lnf) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT)
}

// ownedLink returns the host link called name if it is an ipledger-veth veth,
// with its parsed alias. found is false if there is no such link; an existing
// link that is not ours gives ErrNotOurs.
func ownedLink(h *netlinksafe.Handle, name string) (link netlink.Link, att Attachment, found bool, err error) {
	link, err = h.LinkByName(name)
	if err != nil {
		if isNotFound(err) {
			return nil, Attachment{}, false, nil
		}
		return nil, Attachment{}, false, fmt.Errorf("look up %s: %w", name, err)
	}
	att, ok := ours(link)
	if !ok {
		return link, Attachment{}, true, fmt.Errorf("%w: %s (type %s, alias %q)", ErrNotOurs, name, link.Type(), link.Attrs().Alias)
	}
	return link, att, true, nil
}

// ours reports whether link is a veth carrying an ipledger-veth alias.
func ours(link netlink.Link) (Attachment, bool) {
	if _, isVeth := link.(*netlink.Veth); !isVeth {
		return Attachment{}, false
	}
	return ParseAlias(link.Attrs().Alias)
}

// removeHostLink deletes the host routes through link and then the link itself
// (which removes the pod end too). Already gone is success.
func removeHostLink(h *netlinksafe.Handle, link netlink.Link) error {
	if err := removeHostRoutes(h, link); err != nil {
		return err
	}
	return deleteLink(h, link)
}

// removeHostRoutes deletes the host routes (to single addresses) through link.
// Already gone is success.
func removeHostRoutes(h *netlinksafe.Handle, link netlink.Link) error {
	routes, err := h.RouteList(link, netlink.FAMILY_ALL)
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("list routes of %s: %w", link.Attrs().Name, err)
	}
	for _, r := range routes {
		if r.Dst == nil || r.LinkIndex != link.Attrs().Index {
			continue
		}
		if ones, bits := r.Dst.Mask.Size(); ones != bits {
			continue
		}
		if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) && !isNotFound(err) {
			return fmt.Errorf("delete route %s dev %s: %w", r.Dst, link.Attrs().Name, err)
		}
	}
	return nil
}

// deleteLink deletes link (a veth: the pod end goes with it). Already gone is
// success.
func deleteLink(h *netlinksafe.Handle, link netlink.Link) error {
	if err := h.LinkDel(link); err != nil && !isNotFound(err) {
		return fmt.Errorf("delete %s: %w", link.Attrs().Name, err)
	}
	return nil
}

// createVeth creates the pair: the host end hostName (with alias recording the
// attachment) in the current namespace, the pod end created directly inside the
// pod namespace as ifName, so it never exists in the host namespace.
func createVeth(h *netlinksafe.Handle, hostName, alias string, mtu int, ifName string, pod *NetNS) (netlink.Link, error) {
	v := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: hostName, MTU: mtu, Alias: alias, TxQLen: -1},
		PeerName:      ifName,
		PeerNamespace: netlink.NsFd(int(pod.File.Fd())),
		PeerMTU:       uint32(mtu),
		PeerTxQLen:    -1,
	}
	if err := h.LinkAdd(v); err != nil {
		return nil, fmt.Errorf("create veth %s <-> %s in %s: %w", hostName, ifName, pod.Path, err)
	}
	link, err := h.LinkByName(hostName)
	if err != nil {
		return nil, fmt.Errorf("look up new veth %s: %w", hostName, err)
	}
	if link.Attrs().Alias != alias {
		// Older kernels ignore IFLA_IFALIAS on create.
		if err := h.LinkSetAlias(link, alias); err != nil {
			return link, fmt.Errorf("set alias of %s: %w", hostName, err)
		}
	}
	return link, nil
}

// podHandle opens a netlink handle inside the pod namespace; no thread of the
// plugin changes namespace for longer than the socket creation, and one that
// cannot come back is retired (nsenter), never left to run host code.
func podHandle(pod *NetNS) (*netlinksafe.Handle, error) {
	h, err := nsenter.Handle(int(pod.File.Fd()))
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", pod.Path, err)
	}
	return &netlinksafe.Handle{Handle: h}, nil
}

// configurePod brings lo and ifName up, puts each IP on ifName as a host
// address, and routes the pod through the link-local gateways of its families.
func configurePod(ph *netlinksafe.Handle, ifName string, ips []net.IP, hostMAC net.HardwareAddr, extra []*net.IPNet) (netlink.Link, error) {
	lo, err := ph.LinkByName("lo")
	if err != nil {
		return nil, fmt.Errorf("pod lo: %w", err)
	}
	if err := ph.LinkSetUp(lo); err != nil {
		return nil, fmt.Errorf("pod lo up: %w", err)
	}
	link, err := ph.LinkByName(ifName)
	if err != nil {
		return nil, fmt.Errorf("pod %s: %w", ifName, err)
	}
	for _, ip := range ips {
		a := &netlink.Addr{IPNet: hostNet(ip)}
		if ip.To4() == nil {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := ph.AddrAdd(link, a); err != nil {
			return nil, fmt.Errorf("pod address %s: %w", a.IPNet, err)
		}
	}
	if err := ph.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("pod %s up: %w", ifName, err)
	}
	idx := link.Attrs().Index
	done := map[int]bool{}
	for _, ip := range ips {
		fam := family(ip)
		if done[fam] {
			continue
		}
		done[fam] = true
		gw := gatewayFor(ip)
		if err := ph.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: fam, State: netlink.NUD_PERMANENT, IP: gw, HardwareAddr: hostMAC}); err != nil {
			return nil, fmt.Errorf("pod neighbour %s: %w", gw, err)
		}
		routes := []netlink.Route{}
		if fam == netlink.FAMILY_V4 {
			routes = append(routes, netlink.Route{LinkIndex: idx, Dst: hostNet(gw), Scope: netlink.SCOPE_LINK, Src: ip.To4()})
		}
		routes = append(routes, netlink.Route{LinkIndex: idx, Dst: defaultNet(fam), Gw: gw})
		for _, dst := range extra {
			if family(dst.IP) == fam && !isDefault(dst) {
				routes = append(routes, netlink.Route{LinkIndex: idx, Dst: dst, Gw: gw})
			}
		}
		for _, r := range routes {
			if err := ph.RouteAdd(&r); err != nil {
				return nil, fmt.Errorf("pod route %s via %s: %w", r.Dst, r.Gw, err)
			}
		}
	}
	return link, nil
}

func defaultNet(fam int) *net.IPNet {
	if fam == netlink.FAMILY_V4 {
		return &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	}
	return &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
}

func isDefault(n *net.IPNet) bool {
	ones, _ := n.Mask.Size()
	return ones == 0
}

// configureHost sets the host-side per-interface sysctls, brings the host end up,
// gives it the IPv6 link-local gateway and routes each pod address to it.
func configureHost(h *netlinksafe.Handle, link netlink.Link, ips []net.IP) error {
	name := link.Attrs().Name
	v4, v6 := false, false
	for _, ip := range ips {
		if ip.To4() != nil {
			v4 = true
		} else {
			v6 = true
		}
	}
	if v4 {
		// Answer ARP for 169.254.1.1 and forward what the pod sends. Loose
		// reverse-path filtering (2): a packet from the pod is dropped only when
		// its source is not routable at all. The kernel applies the larger of
		// all's and the interface's value, so 2 here holds on this interface
		// even where the distribution sets a strict (1) all, which stays as is.
		for _, kv := range [][2]string{{"proxy_arp", "1"}, {"forwarding", "1"}, {"rp_filter", "2"}} {
			if err := setIfSysctl("ipv4", name, kv[0], kv[1]); err != nil {
				return err
			}
		}
	}
	if v6 {
		for _, kv := range [][2]string{{"disable_ipv6", "0"}, {"accept_ra", "0"}, {"forwarding", "1"}} {
			if err := setIfSysctl("ipv6", name, kv[0], kv[1]); err != nil {
				return err
			}
		}
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("host %s up: %w", name, err)
	}
	if v6 {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: GatewayV6, Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD, Scope: unix.RT_SCOPE_LINK}
		if err := h.AddrAdd(link, a); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("host %s address %s: %w", name, GatewayV6, err)
		}
	}
	for _, ip := range ips {
		r := netlink.Route{LinkIndex: link.Attrs().Index, Dst: hostNet(ip), Scope: netlink.SCOPE_LINK}
		if ip.To4() == nil {
			r.Scope = netlink.SCOPE_UNIVERSE
		}
		if err := h.RouteAdd(&r); err != nil && (!errors.Is(err, unix.EEXIST) || !replaceNodeRoute(h, &r)) {
			return fmt.Errorf("host route %s dev %s: %w", r.Dst, name, err)
		}
	}
	return nil
}

// replaceNodeRoute puts the pod's host route r in place of the node network's
// route to the same address, and reports whether it did. The node network
// routes a sticky address borrowed by another node to that node (protocol
// routes.Protocol); once the address is this pod's, that route is stale, and
// it may still be there when ADD comes, before this node's agent has seen the
// borrow move. A route of another protocol is another owner's: it stays, and
// ADD fails on it.
func replaceNodeRoute(h *netlinksafe.Handle, r *netlink.Route) bool {
	fam := netlink.FAMILY_V4
	if r.Dst.IP.To4() == nil {
		fam = netlink.FAMILY_V6
	}
	held, err := h.RouteListFiltered(fam, &netlink.Route{Dst: r.Dst, Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil || len(held) == 0 {
		return false
	}
	for _, o := range held {
		if o.Protocol != routes.Protocol {
			return false
		}
	}
	return h.RouteReplace(r) == nil
}

// setIfSysctl writes net.<proto>.conf.<ifName>.<key>; only ever a per-interface key.
func setIfSysctl(proto, ifName, key, value string) error {
	p := filepath.Join("/proc/sys/net", proto, "conf", ifName, key)
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", p, value, err)
	}
	return nil
}

// uplinkMTU is the MTU of the interface that carries the node's address: the
// interface of the namespace's IPv4 default route (main table, lowest metric;
// a multipath route by its first next hop), else of its IPv6 one. Pods get
// that MTU so that what they send fits the node's own link. DefaultMTU when
// there is no default route, or its interface's MTU is one a veth cannot have.
func uplinkMTU(h *netlinksafe.Handle) (int, error) {
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		idx, err := defaultRouteLink(h, fam)
		if err != nil {
			return 0, err
		}
		if idx == 0 {
			continue
		}
		link, err := h.LinkByIndex(idx)
		if err != nil {
			return 0, fmt.Errorf("interface %d of the default route: %w", idx, err)
		}
		if mtu := link.Attrs().MTU; mtu >= 68 && mtu <= 65535 {
			return mtu, nil
		}
		return DefaultMTU, nil
	}
	return DefaultMTU, nil
}

// uplinkProbes are documentation addresses (RFC 5737, RFC 3849) that on most
// nodes only the default route covers: the kernel's route lookup of one, asked
// for the matching table entry, finds the default route in microseconds, where
// listing the table costs about a microsecond per route, each pod's host route
// among them.
var uplinkProbes = map[int]net.IP{
	netlink.FAMILY_V4: net.IPv4(203, 0, 113, 1).To4(),
	netlink.FAMILY_V6: net.ParseIP("2001:db8::1"),
}

// defaultRouteLink is the interface index of the default route of family fam
// in the main table (the lowest metric), 0 when there is none. The lookup of
// the family's probe answers when it meets that route; when it meets a more
// specific route, or none, the main table is listed.
func defaultRouteLink(h *netlinksafe.Handle, fam int) (int, error) {
	if rs, err := h.RouteGetWithOptions(uplinkProbes[fam], &netlink.RouteGetOptions{FIBMatch: true}); err == nil && len(rs) == 1 {
		if idx := defaultLink(rs[0]); idx != 0 {
			return idx, nil
		}
	}
	routes, err := h.RouteListFiltered(fam, &netlink.Route{}, 0)
	if err != nil {
		return 0, fmt.Errorf("list routes to find the default route's MTU: %w", err)
	}
	idx, metric := 0, 0
	for _, r := range routes {
		if li := defaultLink(r); li != 0 && (idx == 0 || r.Priority < metric) {
			idx, metric = li, r.Priority
		}
	}
	return idx, nil
}

// defaultLink is the interface of r (a multipath route's first next hop) when r
// is a unicast default route of the main table, else 0.
func defaultLink(r netlink.Route) int {
	if (r.Dst != nil && !isDefault(r.Dst)) || r.Type != unix.RTN_UNICAST || r.Table != unix.RT_TABLE_MAIN {
		return 0
	}
	if r.LinkIndex == 0 && len(r.MultiPath) > 0 {
		return r.MultiPath[0].LinkIndex
	}
	return r.LinkIndex
}
