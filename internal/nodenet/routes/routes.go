// Package routes keeps the routes of a nodenet plan in the main routing table
// as desired state: routes to other nodes' pod ranges via their addresses, and
// unreachable routes for this node's blocks.
//
// Every route it makes carries Protocol, and it changes or deletes no route of
// another protocol: a route of another owner for a destination it wants is a
// conflict, reported and left alone. A next hop must be on-link (covered by a
// route of this host without gateway, such as an interface address's subnet);
// one that is not gets no route, so a pod range is never routed through a
// gateway it would not reach directly.
//
// The reconciler works through a netlink handle it is given: the host's in the
// agent, one made with netlink.NewHandleAt in a test's namespace.
package routes

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/ipledger/ipledger/internal/nodenet"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Protocol is the route protocol (rtm_protocol) of ipledger's routes: what
// tells them apart from every other route of the table, so that a reconcile can
// delete the stale ones (a deleted Node, a moved block, one left while the
// agent was down) and never anything else.
//
// 201 (0xC9) because nobody else is known to use it: iproute2's rt_protos
// reserves 0-18, 42, 99 and 186-192; flannel's host-gw routes carry the
// default (boot), Calico's boot, bird (12) or 80, Cilium's kernel (2). `ip
// route show proto 201` lists ipledger's routes.
const Protocol netlink.RouteProtocol = 201

// Netlink is what the reconciler needs of a netlink handle; *netlink.Handle
// and netlinksafe.Handle have it.
type Netlink interface {
	RouteListFiltered(family int, filter *netlink.Route, filterMask uint64) ([]netlink.Route, error)
	RouteAdd(route *netlink.Route) error
	RouteReplace(route *netlink.Route) error
	RouteDel(route *netlink.Route) error
	LinkByIndex(index int) (netlink.Link, error)
}

var _ Netlink = (*netlink.Handle)(nil)

// Reconciler keeps ipledger's routes in one network namespace. Its methods
// must not run concurrently with each other.
type Reconciler struct {
	nl Netlink
}

// New returns a reconciler working through nl.
func New(nl Netlink) *Reconciler { return &Reconciler{nl: nl} }

// Report is what a Sync did (or a Check would do).
type Report struct {
	// Installed counts routes added or changed, Removed routes of ours
	// deleted, Unchanged desired routes already in place.
	Installed, Removed, Unchanged int
	// Conflicts are desired destinations held by a route of another
	// protocol: left alone, and no route of ours is kept there.
	Conflicts []Conflict
	// OffLink are desired routes whose next hop no route without gateway
	// covers: not installed.
	OffLink []OffLink
}

// Conflict is a route of another owner for a destination ipledger wants.
type Conflict struct {
	Dst      netip.Prefix
	Protocol netlink.RouteProtocol
	Dev      string     // its device, if any
	Via      netip.Addr // its gateway, if any
}

func (c Conflict) String() string {
	s := fmt.Sprintf("%s proto %s", c.Dst, c.Protocol)
	if c.Via.IsValid() {
		s += " via " + c.Via.String()
	}
	if c.Dev != "" {
		s += " dev " + c.Dev
	}
	return s
}

// OffLink is a desired route whose next hop is not on-link.
type OffLink struct {
	Dst netip.Prefix
	Via netip.Addr
}

func (o OffLink) String() string { return fmt.Sprintf("%s via %s", o.Dst, o.Via) }

// Sync makes ipledger's routes exactly desired: it deletes every route of
// Protocol not desired, and adds or replaces each desired one, except those in
// conflict or off-link (reported). A second Sync with the same input and the
// same table changes nothing. Per-route failures do not stop the others; the
// error joins them.
func (r *Reconciler) Sync(desired []nodenet.Route) (Report, error) {
	return r.reconcile(desired, true)
}

// Check reports what Sync would do, changing nothing.
func (r *Reconciler) Check(desired []nodenet.Route) (Report, error) {
	return r.reconcile(desired, false)
}

// Remove deletes every route of Protocol in the main table (uninstall) and
// returns how many it deleted.
func (r *Reconciler) Remove() (int, error) {
	var n int
	var errs []error
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := r.list(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: Protocol}, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, rt := range routes {
			if err := r.del(rt); err != nil {
				errs = append(errs, err)
				continue
			}
			n++
		}
	}
	return n, errors.Join(errs...)
}

// table is the main table of one namespace, read once per reconcile.
type table struct {
	ours   map[netip.Prefix][]netlink.Route
	others map[netip.Prefix][]netlink.Route
	// onLink are routes without gateway, through which a next hop they
	// cover is reached directly.
	onLink []netlink.Route
}

func (r *Reconciler) read() (*table, error) {
	t := &table{ours: map[netip.Prefix][]netlink.Route{}, others: map[netip.Prefix][]netlink.Route{}}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := r.list(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, err
		}
		for _, rt := range routes {
			dst, ok := prefixOf(rt.Dst)
			if !ok {
				continue
			}
			if rt.Protocol == Protocol {
				t.ours[dst] = append(t.ours[dst], rt)
				continue
			}
			t.others[dst] = append(t.others[dst], rt)
			if rt.Type == unix.RTN_UNICAST && rt.Gw == nil && len(rt.MultiPath) == 0 && rt.LinkIndex > 0 && dst.Bits() > 0 {
				t.onLink = append(t.onLink, rt)
			}
		}
	}
	return t, nil
}

// onLinkDev is the link through which via is reached directly: that of the
// most specific route without gateway covering it (the lowest metric among
// equals). A default route never counts: a node's address is on a subnet.
func (t *table) onLinkDev(via netip.Addr) (int, bool) {
	var best *netlink.Route
	var bestBits int
	for i := range t.onLink {
		rt := &t.onLink[i]
		dst, _ := prefixOf(rt.Dst)
		if !dst.Contains(via) {
			continue
		}
		if best == nil || dst.Bits() > bestBits || (dst.Bits() == bestBits && rt.Priority < best.Priority) {
			best, bestBits = rt, dst.Bits()
		}
	}
	if best == nil {
		return 0, false
	}
	return best.LinkIndex, true
}

func (r *Reconciler) reconcile(desired []nodenet.Route, apply bool) (Report, error) {
	var rep Report
	var errs []error
	t, err := r.read()
	if err != nil {
		return rep, err
	}

	want := make(map[netip.Prefix]nodenet.Route, len(desired))
	var order []netip.Prefix
	for _, d := range desired {
		if err := validate(d); err != nil {
			errs = append(errs, err)
			continue
		}
		dst := d.Dst.Masked()
		if _, dup := want[dst]; dup {
			errs = append(errs, fmt.Errorf("%w: %s asked twice", ErrInvalidRoute, dst))
			continue
		}
		want[dst] = d
		order = append(order, dst)
	}
	slices.SortFunc(order, comparePrefix)

	remove := func(rts []netlink.Route) {
		for _, rt := range rts {
			if apply {
				if err := r.del(rt); err != nil {
					errs = append(errs, err)
					continue
				}
			}
			rep.Removed++
		}
	}

	// Stale routes first: a moved block frees its destination before the
	// new routes go in.
	var stale []netip.Prefix
	for dst := range t.ours {
		if _, ok := want[dst]; !ok {
			stale = append(stale, dst)
		}
	}
	slices.SortFunc(stale, comparePrefix)
	for _, dst := range stale {
		remove(t.ours[dst])
	}

	for _, dst := range order {
		d := want[dst]
		existing := t.ours[dst]
		if theirs := t.others[dst]; len(theirs) > 0 {
			for _, rt := range theirs {
				rep.Conflicts = append(rep.Conflicts, r.conflict(dst, rt))
			}
			remove(existing)
			continue
		}
		rt := netlink.Route{
			Family:   family(dst),
			Dst:      ipNet(dst),
			Table:    unix.RT_TABLE_MAIN,
			Protocol: Protocol,
		}
		switch d.Type {
		case nodenet.Unicast:
			via := d.Via.Unmap()
			idx, ok := t.onLinkDev(via)
			if !ok {
				rep.OffLink = append(rep.OffLink, OffLink{Dst: dst, Via: via})
				remove(existing)
				continue
			}
			rt.Type = unix.RTN_UNICAST
			rt.Gw = via.AsSlice()
			rt.LinkIndex = idx
		case nodenet.Unreachable:
			rt.Type = unix.RTN_UNREACHABLE
		}
		if len(existing) == 1 && same(existing[0], rt) {
			rep.Unchanged++
			continue
		}
		if !apply {
			rep.Removed += max(len(existing)-1, 0)
			rep.Installed++
			continue
		}
		var err error
		switch len(existing) {
		case 0:
			err = r.nl.RouteAdd(&rt)
		case 1:
			// In place (same metric, which is what the kernel matches): the
			// destination is never without a route.
			rt.Priority = existing[0].Priority
			err = r.nl.RouteReplace(&rt)
		default:
			remove(existing)
			err = r.nl.RouteAdd(&rt)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("install route %s: %w", describe(rt), err))
			continue
		}
		rep.Installed++
	}
	slices.SortFunc(rep.Conflicts, func(a, b Conflict) int {
		return cmp.Or(comparePrefix(a.Dst, b.Dst), cmp.Compare(a.Protocol, b.Protocol))
	})
	return rep, errors.Join(errs...)
}

func (r *Reconciler) conflict(dst netip.Prefix, rt netlink.Route) Conflict {
	c := Conflict{Dst: dst, Protocol: rt.Protocol}
	if gw, ok := netip.AddrFromSlice(rt.Gw); ok {
		c.Via = gw.Unmap()
	}
	if rt.LinkIndex > 0 {
		if l, err := r.nl.LinkByIndex(rt.LinkIndex); err == nil {
			c.Dev = l.Attrs().Name
		} else {
			c.Dev = fmt.Sprintf("if%d", rt.LinkIndex)
		}
	}
	return c
}

// del deletes a route of ours as listed. The request carries Protocol, which
// the kernel matches, so it can delete no route of another owner.
func (r *Reconciler) del(rt netlink.Route) error {
	req := netlink.Route{
		Family:   rt.Family,
		Dst:      rt.Dst,
		Table:    rt.Table,
		Protocol: Protocol,
		Type:     rt.Type,
		Priority: rt.Priority,
		Tos:      rt.Tos,
		Scope:    netlink.SCOPE_NOWHERE, // any scope
	}
	if err := r.nl.RouteDel(&req); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("delete route %s: %w", describe(rt), err)
	}
	return nil
}

// list lists routes, again when the kernel interrupted the dump (the table
// changed meanwhile).
func (r *Reconciler) list(fam int, filter *netlink.Route, mask uint64) ([]netlink.Route, error) {
	var err error
	for range 5 {
		var routes []netlink.Route
		routes, err = r.nl.RouteListFiltered(fam, filter, mask)
		if err == nil {
			return routes, nil
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return nil, fmt.Errorf("list routes: %w", err)
}

// same reports whether the installed route of ours is the one wanted.
func same(have, want netlink.Route) bool {
	if have.Type != want.Type {
		return false
	}
	if want.Type != unix.RTN_UNICAST {
		return true
	}
	return len(have.MultiPath) == 0 && have.LinkIndex == want.LinkIndex && have.Gw.Equal(want.Gw)
}

func validate(d nodenet.Route) error {
	if !d.Dst.IsValid() || d.Dst.Addr().Is4In6() || d.Dst.Addr().Zone() != "" {
		return fmt.Errorf("%w: destination %v", ErrInvalidRoute, d.Dst)
	}
	switch d.Type {
	case nodenet.Unicast:
		via := d.Via.Unmap()
		if !via.IsValid() || via.Is4() != d.Dst.Addr().Is4() {
			return fmt.Errorf("%w: %s via %v", ErrInvalidRoute, d.Dst, d.Via)
		}
	case nodenet.Unreachable:
	default:
		return fmt.Errorf("%w: %s of type %v", ErrInvalidRoute, d.Dst, d.Type)
	}
	return nil
}

func describe(rt netlink.Route) string {
	s := rt.Dst.String()
	switch {
	case rt.Type == unix.RTN_UNREACHABLE:
		s = "unreachable " + s
	case rt.Gw != nil:
		s += " via " + rt.Gw.String()
	}
	return s
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	ones, bits := n.Mask.Size()
	if bits != a.BitLen() {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, ones).Masked(), true
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func family(p netip.Prefix) int {
	if p.Addr().Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}
