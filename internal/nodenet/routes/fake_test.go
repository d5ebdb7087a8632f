package routes_test

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/ipledger/ipledger/internal/nodenet/routes"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// fakeNetlink is a main table in memory that keys routes as the kernel does
// (table, destination, TOS, metric; IPv6 routes added without metric get
// 1024), records every change asked of it, and fails on demand.
type fakeNetlink struct {
	mu     sync.Mutex
	routes []netlink.Route
	ops    []string // "add 10.244.2.0/24 metric 0", "replace ...", "del ..."
	// fail, when set, is asked before each call ("list", "add", "replace",
	// "del"); an error it returns is the call's.
	fail   func(op string, rt *netlink.Route) error
	closed bool
}

var _ routes.Netlink = (*fakeNetlink)(nil)

type fakeKey struct {
	table, tos, priority int
	dst                  netip.Prefix
}

func keyOf(rt *netlink.Route) fakeKey {
	ones, _ := rt.Dst.Mask.Size()
	a, _ := netip.AddrFromSlice(rt.Dst.IP)
	return fakeKey{rt.Table, rt.Tos, rt.Priority, netip.PrefixFrom(a.Unmap(), ones).Masked()}
}

func (f *fakeNetlink) normalize(rt *netlink.Route) netlink.Route {
	c := *rt
	if c.Table == 0 {
		c.Table = unix.RT_TABLE_MAIN
	}
	if c.Priority == 0 && c.Dst.IP.To4() == nil {
		c.Priority = 1024
	}
	if c.Type == 0 {
		c.Type = unix.RTN_UNICAST
	}
	return c
}

func (f *fakeNetlink) check(op string, rt *netlink.Route) error {
	if f.closed {
		return fmt.Errorf("fake netlink: %s on a closed handle", op)
	}
	if f.fail != nil {
		return f.fail(op, rt)
	}
	return nil
}

func (f *fakeNetlink) record(op string, rt netlink.Route) {
	k := keyOf(&rt)
	f.ops = append(f.ops, fmt.Sprintf("%s %s metric %d", op, k.dst, k.priority))
}

func (f *fakeNetlink) find(k fakeKey) int {
	return slices.IndexFunc(f.routes, func(r netlink.Route) bool { return keyOf(&r) == k })
}

func (f *fakeNetlink) RouteListFiltered(family int, filter *netlink.Route, mask uint64) ([]netlink.Route, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("list", filter); err != nil {
		return nil, err
	}
	var out []netlink.Route
	for _, r := range f.routes {
		if (r.Dst.IP.To4() != nil) != (family == netlink.FAMILY_V4) {
			continue
		}
		if mask&netlink.RT_FILTER_TABLE != 0 && r.Table != filter.Table {
			continue
		}
		if mask&netlink.RT_FILTER_PROTOCOL != 0 && r.Protocol != filter.Protocol {
			continue
		}
		r.Family = family
		out = append(out, r)
	}
	return out, nil
}

func (f *fakeNetlink) RouteAdd(rt *netlink.Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("add", rt); err != nil {
		return err
	}
	r := f.normalize(rt)
	if f.find(keyOf(&r)) >= 0 {
		return unix.EEXIST
	}
	f.record("add", r)
	f.routes = append(f.routes, r)
	return nil
}

func (f *fakeNetlink) RouteReplace(rt *netlink.Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("replace", rt); err != nil {
		return err
	}
	r := f.normalize(rt)
	f.record("replace", r)
	if i := f.find(keyOf(&r)); i >= 0 {
		f.routes[i] = r
		return nil
	}
	f.routes = append(f.routes, r)
	return nil
}

func (f *fakeNetlink) RouteDel(rt *netlink.Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("del", rt); err != nil {
		return err
	}
	r := f.normalize(rt)
	i := f.find(keyOf(&r))
	if i < 0 || (rt.Protocol != 0 && f.routes[i].Protocol != rt.Protocol) {
		return unix.ESRCH
	}
	f.record("del", f.routes[i])
	f.routes = slices.Delete(f.routes, i, i+1)
	return nil
}

func (f *fakeNetlink) LinkByIndex(index int) (netlink.Link, error) {
	return &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: index, Name: fmt.Sprintf("eth%d", index-2)}}, nil
}

func (f *fakeNetlink) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
}

// takeOps returns the changes recorded since the last call.
func (f *fakeNetlink) takeOps() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	ops := f.ops
	f.ops = nil
	return ops
}

// link adds the on-link route of an interface (index) address's subnet.
func (f *fakeNetlink) link(index int, subnet string) {
	p := netip.MustParsePrefix(subnet)
	f.routes = append(f.routes, netlink.Route{Table: unix.RT_TABLE_MAIN, Dst: ipNet(p), LinkIndex: index, Protocol: unix.RTPROT_KERNEL, Type: unix.RTN_UNICAST, Scope: netlink.SCOPE_LINK})
}

// put adds a route as it would be listed.
func (f *fakeNetlink) put(dst, gw string, proto netlink.RouteProtocol, metric, typ int) {
	p := netip.MustParsePrefix(dst)
	r := netlink.Route{Table: unix.RT_TABLE_MAIN, Dst: ipNet(p), Protocol: proto, Priority: metric, Type: typ}
	if gw != "" {
		r.Gw = netip.MustParseAddr(gw).AsSlice()
		r.LinkIndex = 2
	}
	f.routes = append(f.routes, f.normalize(&r))
}
