// Package routes keeps the routes of a nodenet plan in the main routing table
// as desired state: routes to other nodes' pod ranges via their addresses, and
// unreachable routes for this node's own ranges.
//
// Every route it makes carries Protocol, and it changes or deletes no route of
// another protocol: a route of another owner for a destination it wants is a
// conflict, reported and left alone. A next hop must be on-link (covered by a
// route of this host without gateway, such as an interface address's subnet);
// one that is not gets no route, so a pod range is never routed through a
// gateway it would not reach directly.
//
// A sync is a plan, then its application: Diff compares the desired routes with
// the table as listed and returns what to add, replace and delete, keyed as the
// kernel keys routes (table, destination, TOS, metric); Apply carries a plan out.
// A table already as desired plans nothing, and a route of ours whose key is
// kept is changed in place, never deleted and added again.
//
// The reconciler works through a netlink handle: a fixed one (New), or one it
// opens and, after a failed sync, closes and opens again (NewOpener).
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

// metricV6 is the metric the kernel gives an IPv6 route added without one
// (IP6_RT_PRIO_USER): the metric of ipledger's IPv6 routes, so that a listed
// route and a desired one have the same key.
const metricV6 = 1024

// Netlink is what the reconciler needs of a netlink handle; *netlink.Handle
// has it.
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
	open func() (Netlink, error) // nil: nl is fixed
	nl   Netlink
}

// New returns a reconciler working through nl, for good.
func New(nl Netlink) *Reconciler { return &Reconciler{nl: nl} }

// NewOpener returns a reconciler working through a handle open returns: opened
// at the first sync, and again at the sync after one that failed (the failed
// handle is closed if it has a Close method), so that a handle whose socket
// went bad is not used twice.
func NewOpener(open func() (Netlink, error)) *Reconciler { return &Reconciler{open: open} }

func (r *Reconciler) handle() (Netlink, error) {
	if r.nl == nil {
		nl, err := r.open()
		if err != nil {
			return nil, fmt.Errorf("open netlink: %w", err)
		}
		r.nl = nl
	}
	return r.nl, nil
}

// drop closes the handle after a failure, when the reconciler can open
// another.
func (r *Reconciler) drop() {
	if r.open == nil || r.nl == nil {
		return
	}
	if c, ok := r.nl.(interface{ Close() }); ok {
		c.Close()
	}
	r.nl = nil
}

// Report is what a Sync did (or a Check would do).
type Report struct {
	// Installed counts routes added or changed, Removed routes of ours
	// deleted, Unchanged desired routes already in place.
	Installed, Removed, Unchanged int
	// Conflicts are desired destinations held by a route of another
	// protocol: left alone, and no route of ours is kept there.
	Conflicts []Conflict
	// Inside are routes of another protocol more specific than a desired
	// destination (a leftover blackhole of another CNI in a pod range): they
	// take part of its addresses. Left alone; the route of ours stays.
	Inside []Conflict
	// OffLink are desired routes whose next hop no route without gateway
	// covers: not installed.
	OffLink []OffLink
}

// Conflict is a route of another owner for a destination ipledger wants, or
// inside one.
type Conflict struct {
	Dst      netip.Prefix
	Protocol netlink.RouteProtocol
	Kind     string     // its type when not unicast: "blackhole", "unreachable", ...
	Dev      string     // its device, if any
	Via      netip.Addr // its gateway, if any
	// Range is the desired destination an Inside route is in; zero for a
	// Conflict.
	Range netip.Prefix `json:",omitzero"`
	link  int
}

func (c Conflict) String() string {
	s := fmt.Sprintf("%s proto %s", c.Dst, c.Protocol)
	if c.Kind != "" {
		s = c.Kind + " " + s
	}
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

// Key is how the kernel tells routes of a table apart when it adds, replaces
// or deletes one: two routes of ours with the same key cannot both exist, and
// a route replaced under its key is never missing.
type Key struct {
	Table    int
	Dst      netip.Prefix
	Tos      int
	Priority int
}

func (k Key) String() string {
	return fmt.Sprintf("%s table %d tos %d metric %d", k.Dst, k.Table, k.Tos, k.Priority)
}

func compareKey(a, b Key) int {
	return cmp.Or(cmp.Compare(a.Table, b.Table), comparePrefix(a.Dst, b.Dst), cmp.Compare(a.Tos, b.Tos), cmp.Compare(a.Priority, b.Priority))
}

// Entry is a route of ours: its key and what it says.
type Entry struct {
	Key
	Type      int        // unix.RTN_UNICAST or unix.RTN_UNREACHABLE
	Via       netip.Addr // unicast: the next hop
	LinkIndex int        // unicast: the device the next hop is on
	multipath bool       // as listed: several next hops (never desired)
}

func (e Entry) String() string {
	switch {
	case e.Type == unix.RTN_UNREACHABLE:
		return "unreachable " + e.Dst.String()
	case e.Via.IsValid():
		return fmt.Sprintf("%s via %s", e.Dst, e.Via)
	}
	return e.Dst.String()
}

// same reports whether a listed route of ours says what the desired one does.
func same(have, want Entry) bool {
	if have.Type != want.Type || have.multipath {
		return false
	}
	if want.Type != unix.RTN_UNICAST {
		return true
	}
	return have.LinkIndex == want.LinkIndex && have.Via == want.Via
}

func (e Entry) route() *netlink.Route {
	rt := &netlink.Route{
		Family:   family(e.Dst),
		Dst:      ipNet(e.Dst),
		Table:    e.Table,
		Tos:      e.Tos,
		Priority: e.Priority,
		Protocol: Protocol,
		Type:     e.Type,
	}
	if e.Type == unix.RTN_UNICAST {
		rt.Gw = e.Via.AsSlice()
		rt.LinkIndex = e.LinkIndex
	}
	return rt
}

// Plan is what a sync changes: routes of ours to add (their key is free),
// replace (a route of ours with their key says something else) and delete (no
// longer desired, or another key than the desired one for a destination), and
// the report of the table as found. Applied in that order: a destination that
// keeps a route of ours is never without one.
type Plan struct {
	Add, Replace, Delete []Entry
	Report               Report
}

// Empty reports whether the plan changes nothing.
func (p Plan) Empty() bool { return len(p.Add)+len(p.Replace)+len(p.Delete) == 0 }

// Diff plans the changes that make ipledger's routes in the main table exactly
// desired, given every route of the namespace (actual; routes of other tables
// are ignored). It is pure. An invalid desired route is left out and named in
// the error (ErrInvalidRoute); the plan holds the rest.
//
// A unicast route goes via the first of its Via and Alt that is on-link. A
// desired destination held by a route of another protocol is a Conflict, a
// unicast route none of whose next hops is on-link is OffLink (naming Via):
// neither is planned, and a route of ours there is deleted.
func Diff(desired []nodenet.Route, actual []netlink.Route) (Plan, error) {
	var plan Plan
	var errs []error

	ours := map[Key]Entry{}
	others := map[netip.Prefix][]netlink.Route{}
	var onLink []netlink.Route
	var otherDsts []netip.Prefix
	for _, rt := range actual {
		if rt.Table != unix.RT_TABLE_MAIN {
			continue
		}
		dst, ok := prefixOf(rt.Dst)
		if !ok {
			continue
		}
		if rt.Protocol == Protocol {
			e := Entry{Key: Key{Table: rt.Table, Dst: dst, Tos: rt.Tos, Priority: rt.Priority}, Type: rt.Type, LinkIndex: rt.LinkIndex, multipath: len(rt.MultiPath) > 0}
			if gw, ok := netip.AddrFromSlice(rt.Gw); ok {
				e.Via = gw.Unmap()
			}
			ours[e.Key] = e
			continue
		}
		if _, seen := others[dst]; !seen {
			otherDsts = append(otherDsts, dst)
		}
		others[dst] = append(others[dst], rt)
		if rt.Type == unix.RTN_UNICAST && rt.Gw == nil && len(rt.MultiPath) == 0 && rt.LinkIndex > 0 && dst.Bits() > 0 {
			onLink = append(onLink, rt)
		}
	}
	slices.SortFunc(otherDsts, comparePrefix)

	var want []nodenet.Route
	seen := map[netip.Prefix]bool{}
	for _, d := range desired {
		if err := validate(d); err != nil {
			errs = append(errs, err)
			continue
		}
		d.Dst = d.Dst.Masked()
		if seen[d.Dst] {
			errs = append(errs, fmt.Errorf("%w: %s asked twice", ErrInvalidRoute, d.Dst))
			continue
		}
		seen[d.Dst] = true
		want = append(want, d)
	}
	slices.SortFunc(want, func(a, b nodenet.Route) int { return comparePrefix(a.Dst, b.Dst) })

	keep := map[Key]bool{}
	rep := &plan.Report
	for _, d := range want {
		dst := d.Dst
		if theirs := others[dst]; len(theirs) > 0 {
			for _, rt := range theirs {
				rep.Conflicts = append(rep.Conflicts, conflict(dst, rt, netip.Prefix{}))
			}
			continue
		}
		rep.Inside = append(rep.Inside, inside(d, otherDsts, others)...)
		e := Entry{Key: Key{Table: unix.RT_TABLE_MAIN, Dst: dst}}
		if dst.Addr().Is6() {
			e.Priority = metricV6
		}
		switch d.Type {
		case nodenet.Unicast:
			// the first of the owner's addresses that is on-link
			var via netip.Addr
			var idx int
			for _, a := range append([]netip.Addr{d.Via}, d.Alt...) {
				if a = a.Unmap(); a.Is4() != dst.Addr().Is4() {
					continue
				}
				if i, ok := onLinkDev(onLink, a); ok {
					via, idx = a, i
					break
				}
			}
			if !via.IsValid() {
				rep.OffLink = append(rep.OffLink, OffLink{Dst: dst, Via: d.Via.Unmap()})
				continue
			}
			e.Type, e.Via, e.LinkIndex = unix.RTN_UNICAST, via, idx
		case nodenet.Unreachable:
			e.Type = unix.RTN_UNREACHABLE
		}
		keep[e.Key] = true
		have, ok := ours[e.Key]
		switch {
		case !ok:
			plan.Add = append(plan.Add, e)
		case same(have, e):
			rep.Unchanged++
		default:
			plan.Replace = append(plan.Replace, e)
		}
	}
	for k, e := range ours {
		if !keep[k] {
			plan.Delete = append(plan.Delete, e)
		}
	}
	slices.SortFunc(plan.Delete, func(a, b Entry) int { return compareKey(a.Key, b.Key) })
	slices.SortFunc(rep.Conflicts, func(a, b Conflict) int {
		return cmp.Or(comparePrefix(a.Dst, b.Dst), cmp.Compare(a.Protocol, b.Protocol))
	})
	rep.Installed, rep.Removed = len(plan.Add)+len(plan.Replace), len(plan.Delete)
	return plan, errors.Join(errs...)
}

// inside returns the routes of other owners strictly inside d's destination,
// except, in a range of this node (Unreachable), host routes without gateway:
// those are its pods'.
func inside(d nodenet.Route, sortedDsts []netip.Prefix, others map[netip.Prefix][]netlink.Route) []Conflict {
	var out []Conflict
	i, _ := slices.BinarySearchFunc(sortedDsts, d.Dst, comparePrefix)
	for ; i < len(sortedDsts) && d.Dst.Contains(sortedDsts[i].Addr()); i++ {
		dst := sortedDsts[i]
		if dst.Bits() <= d.Dst.Bits() {
			continue
		}
		for _, rt := range others[dst] {
			if d.Type == nodenet.Unreachable && dst.IsSingleIP() && rt.Gw == nil && rt.Type == unix.RTN_UNICAST {
				continue
			}
			out = append(out, conflict(dst, rt, d.Dst))
		}
	}
	return out
}

func conflict(dst netip.Prefix, rt netlink.Route, in netip.Prefix) Conflict {
	c := Conflict{Dst: dst, Protocol: rt.Protocol, Range: in, link: rt.LinkIndex}
	if gw, ok := netip.AddrFromSlice(rt.Gw); ok {
		c.Via = gw.Unmap()
	}
	if rt.Type != unix.RTN_UNICAST {
		c.Kind = typeName(rt.Type)
	}
	return c
}

func typeName(t int) string {
	switch t {
	case unix.RTN_BLACKHOLE:
		return "blackhole"
	case unix.RTN_UNREACHABLE:
		return "unreachable"
	case unix.RTN_PROHIBIT:
		return "prohibit"
	case unix.RTN_THROW:
		return "throw"
	case unix.RTN_LOCAL:
		return "local"
	}
	return fmt.Sprintf("type%d", t)
}

// onLinkDev is the link through which via is reached directly: that of the
// most specific route without gateway covering it (the lowest metric among
// equals). A default route never counts: a node's address is on a subnet.
func onLinkDev(onLink []netlink.Route, via netip.Addr) (int, bool) {
	var best *netlink.Route
	var bestBits int
	for i := range onLink {
		rt := &onLink[i]
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

// Applied is what Apply carried out of a plan.
type Applied struct {
	Installed, Removed int
}

// Apply carries out p through nl: adds, then replaces, then deletes, each
// route on its own, so one failure does not stop the others; the error joins
// the failures. A delete carries Protocol, which the kernel matches, so it can
// delete no route of another owner; a route already gone counts as deleted.
func Apply(nl Netlink, p Plan) (Applied, error) {
	var done Applied
	var errs []error
	for _, e := range p.Add {
		if err := nl.RouteAdd(e.route()); err != nil {
			errs = append(errs, fmt.Errorf("add route %s: %w", e, err))
			continue
		}
		done.Installed++
	}
	for _, e := range p.Replace {
		if err := nl.RouteReplace(e.route()); err != nil {
			errs = append(errs, fmt.Errorf("replace route %s: %w", e, err))
			continue
		}
		done.Installed++
	}
	for _, e := range p.Delete {
		req := &netlink.Route{
			Family:   family(e.Dst),
			Dst:      ipNet(e.Dst),
			Table:    e.Table,
			Tos:      e.Tos,
			Priority: e.Priority,
			Protocol: Protocol,
			Type:     e.Type,
			Scope:    netlink.SCOPE_NOWHERE, // any scope
		}
		if err := nl.RouteDel(req); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route %s: %w", e, err))
			continue
		}
		done.Removed++
	}
	return done, errors.Join(errs...)
}

// Sync makes ipledger's routes exactly desired: it deletes every route of
// Protocol not desired, and adds or replaces each desired one, except those in
// conflict or off-link (reported). A second Sync with the same input and the
// same table plans nothing. Per-route failures do not stop the others; the
// error joins them. After a failure of the kernel (not of an invalid desired
// route), a reconciler made by NewOpener opens a new handle for the next sync.
func (r *Reconciler) Sync(desired []nodenet.Route) (Report, error) {
	nl, plan, invalid, err := r.plan(desired)
	if err != nil {
		return Report{}, err
	}
	rep := plan.Report
	rep.Installed, rep.Removed = 0, 0
	done, err := Apply(nl, plan)
	rep.Installed, rep.Removed = done.Installed, done.Removed
	if err != nil {
		r.drop()
	}
	return rep, errors.Join(invalid, err)
}

// Check reports what Sync would do, changing nothing.
func (r *Reconciler) Check(desired []nodenet.Route) (Report, error) {
	_, plan, invalid, err := r.plan(desired)
	if err != nil {
		return Report{}, err
	}
	return plan.Report, invalid
}

// Remove deletes every route of Protocol in the main table (uninstall, or the
// routes turned off) and returns how many it deleted.
func (r *Reconciler) Remove() (int, error) {
	rep, err := r.Sync(nil)
	return rep.Removed, err
}

// plan reads the table and diffs it with desired; invalid is the error of
// the desired routes left out, err one that stops the sync.
func (r *Reconciler) plan(desired []nodenet.Route) (nl Netlink, plan Plan, invalid, err error) {
	if nl, err = r.handle(); err != nil {
		return nil, Plan{}, nil, err
	}
	actual, err := read(nl)
	if err != nil {
		r.drop()
		return nil, Plan{}, nil, err
	}
	plan, invalid = Diff(desired, actual)
	names(nl, plan.Report.Conflicts)
	names(nl, plan.Report.Inside)
	return nl, plan, invalid, nil
}

// names fills in the conflicting routes' device names (link indexes are not
// reported).
func names(nl Netlink, cs []Conflict) {
	for i := range cs {
		c := &cs[i]
		if c.link <= 0 {
			continue
		}
		if l, err := nl.LinkByIndex(c.link); err == nil {
			c.Dev = l.Attrs().Name
		} else {
			c.Dev = fmt.Sprintf("if%d", c.link)
		}
		c.link = 0
	}
}

// read lists the main table of both families.
func read(nl Netlink) ([]netlink.Route, error) {
	var all []netlink.Route
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := list(nl, fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, err
		}
		all = append(all, routes...)
	}
	return all, nil
}

// list lists routes, again when the kernel interrupted the dump (the table
// changed meanwhile).
func list(nl Netlink, fam int, filter *netlink.Route, mask uint64) ([]netlink.Route, error) {
	var err error
	for range 5 {
		var routes []netlink.Route
		routes, err = nl.RouteListFiltered(fam, filter, mask)
		if err == nil {
			return routes, nil
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return nil, fmt.Errorf("list routes: %w", err)
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
