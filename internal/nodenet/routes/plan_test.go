package routes_test

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/nodenet"
	"github.com/ipledger/ipledger/internal/nodenet/routes"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// newFake is a node whose eth0 (index 2) is on 10.250.0.0/24 and fd00:250::/64.
func newFake() *fakeNetlink {
	f := &fakeNetlink{}
	f.link(2, "10.250.0.0/24")
	f.link(2, "fd00:250::/64")
	return f
}

func listAll(t *testing.T, nl routes.Netlink) []netlink.Route {
	t.Helper()
	var all []netlink.Route
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := nl.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, rs...)
	}
	return all
}

func TestSecondSyncPlansNothing(t *testing.T) {
	f := newFake()
	f.put("10.244.8.0/24", "10.250.0.13", routes.Protocol, 0, unix.RTN_UNICAST) // stale
	desired := []nodenet.Route{
		via("10.244.2.0/24", "10.250.0.12"),
		via("fd00:244:0:2::/64", "fd00:250::12"),
		unreachable("10.96.0.0/26"),
		unreachable("fd00:96::/122"),
	}
	rec := routes.New(f)
	rep, err := rec.Sync(desired)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Installed != 4 || rep.Removed != 1 {
		t.Errorf("first Sync: %+v, want 4 installed 1 removed", rep)
	}
	f.takeOps()
	plan, err := routes.Diff(desired, listAll(t, f))
	if err != nil || !plan.Empty() {
		t.Errorf("Diff of the synced table: %+v, %v; want an empty plan", plan, err)
	}
	rep, err = rec.Sync(desired)
	if err != nil {
		t.Fatal(err)
	}
	if ops := f.takeOps(); len(ops) != 0 || rep.Unchanged != 4 || rep.Installed != 0 || rep.Removed != 0 {
		t.Errorf("second Sync of an unchanged table: %+v, changes %q; want none", rep, ops)
	}
}

// Two routes of ours on one destination (an older ipledger's metric beside
// today's): the one under the desired key is replaced in place and the other
// deleted after, so the destination always has a route.
func TestSameKeyReplacedInPlace(t *testing.T) {
	f := newFake()
	f.put("10.244.2.0/24", "10.250.0.13", routes.Protocol, 0, unix.RTN_UNICAST)
	f.put("10.244.2.0/24", "10.250.0.14", routes.Protocol, 10, unix.RTN_UNICAST)
	f.put("fd00:244:0:2::/64", "", routes.Protocol, 1024, unix.RTN_UNREACHABLE)
	desired := []nodenet.Route{
		via("10.244.2.0/24", "10.250.0.12"),
		via("fd00:244:0:2::/64", "fd00:250::12"),
	}
	rep, err := routes.New(f).Sync(desired)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"replace 10.244.2.0/24 metric 0",
		"replace fd00:244:0:2::/64 metric 1024",
		"del 10.244.2.0/24 metric 10",
	}
	if ops := f.takeOps(); !slices.Equal(ops, want) {
		t.Errorf("changes:\n%s\nwant:\n%s", strings.Join(ops, "\n"), strings.Join(want, "\n"))
	}
	if rep.Installed != 2 || rep.Removed != 1 {
		t.Errorf("report %+v, want 2 installed 1 removed", rep)
	}
}

// A failed sync reports its error, and the next one works through a new
// handle: the one that failed is closed.
func TestFailedSyncReopens(t *testing.T) {
	first := newFake()
	first.fail = func(op string, _ *netlink.Route) error {
		if op == "add" {
			return unix.ENOBUFS
		}
		return nil
	}
	second := newFake()
	var opened []*fakeNetlink
	rec := routes.NewOpener(func() (routes.Netlink, error) {
		h := []*fakeNetlink{first, second}[min(len(opened), 1)]
		opened = append(opened, h)
		return h, nil
	})
	desired := []nodenet.Route{via("10.244.2.0/24", "10.250.0.12")}
	if _, err := rec.Sync(desired); !errors.Is(err, unix.ENOBUFS) {
		t.Fatalf("Sync through a failing handle: %v, want ENOBUFS", err)
	}
	if !first.closed {
		t.Error("the failed handle was not closed")
	}
	rep, err := rec.Sync(desired)
	if err != nil || rep.Installed != 1 {
		t.Fatalf("Sync after the failure: %+v, %v", rep, err)
	}
	if len(opened) != 2 {
		t.Errorf("opened %d handles, want 2", len(opened))
	}
	if ops := second.takeOps(); !slices.Equal(ops, []string{"add 10.244.2.0/24 metric 0"}) {
		t.Errorf("changes through the new handle: %q", ops)
	}
	// Nothing failed: the handle is kept.
	if _, err := rec.Sync(desired); err != nil || len(opened) != 2 || second.closed {
		t.Errorf("a sync that did not fail: %v, %d handles opened, closed %v", err, len(opened), second.closed)
	}
}

// One failing route does not stop the others; the report counts what was done.
func TestApplyGoesOn(t *testing.T) {
	f := newFake()
	f.put("10.244.8.0/24", "10.250.0.13", routes.Protocol, 0, unix.RTN_UNICAST)
	f.fail = func(op string, rt *netlink.Route) error {
		if op == "add" && rt.Dst.String() == "10.244.2.0/24" {
			return unix.EINVAL
		}
		return nil
	}
	rep, err := routes.New(f).Sync([]nodenet.Route{via("10.244.2.0/24", "10.250.0.12"), via("10.244.3.0/24", "10.250.0.13")})
	if !errors.Is(err, unix.EINVAL) || !strings.Contains(err.Error(), "10.244.2.0/24") {
		t.Errorf("Sync: %v, want EINVAL naming 10.244.2.0/24", err)
	}
	if rep.Installed != 1 || rep.Removed != 1 {
		t.Errorf("report %+v, want 1 installed 1 removed", rep)
	}
}

// A Node listing first an address of a network this node is not on: the
// route goes via its first address that is on-link.
func TestOnLinkAddressChosen(t *testing.T) {
	f := newFake()
	desired := []nodenet.Route{
		{Dst: pfx("10.244.2.0/24"), Via: ip("192.168.7.12"), Alt: []netip.Addr{ip("172.16.0.12"), ip("10.250.0.12"), ip("10.250.0.99")}, Type: nodenet.Unicast},
		{Dst: pfx("10.244.3.0/24"), Via: ip("192.168.7.13"), Alt: []netip.Addr{ip("172.16.0.13")}, Type: nodenet.Unicast},
	}
	rep, err := routes.New(f).Sync(desired)
	if err != nil {
		t.Fatal(err)
	}
	if want := []routes.OffLink{{Dst: pfx("10.244.3.0/24"), Via: ip("192.168.7.13")}}; !slices.Equal(rep.OffLink, want) {
		t.Errorf("off-link %v, want %v", rep.OffLink, want)
	}
	var got []string
	for _, r := range listAll(t, f) {
		if r.Protocol == routes.Protocol {
			got = append(got, r.Dst.String()+" via "+r.Gw.String())
		}
	}
	if want := []string{"10.244.2.0/24 via 10.250.0.12"}; !slices.Equal(got, want) {
		t.Errorf("routes of ours %v, want %v", got, want)
	}
}

// Foreign routes more specific than a desired destination are reported, except
// the host routes of this node's own pods in its own range.
func TestInsideReported(t *testing.T) {
	f := newFake()
	f.put("10.244.2.64/26", "", unix.RTPROT_BOOT, 0, unix.RTN_BLACKHOLE)  // another CNI's leftover
	f.put("10.244.0.128/26", "", unix.RTPROT_BOOT, 0, unix.RTN_BLACKHOLE) // in our own range
	f.routes = append(f.routes, netlink.Route{Table: unix.RT_TABLE_MAIN, Dst: ipNet(pfx("10.244.0.7/32")), LinkIndex: 9, Protocol: unix.RTPROT_BOOT, Type: unix.RTN_UNICAST, Scope: netlink.SCOPE_LINK})
	f.put("10.244.3.0/24", "", unix.RTPROT_BOOT, 0, unix.RTN_BLACKHOLE) // outside every desired range
	desired := []nodenet.Route{unreachable("10.244.0.0/24"), via("10.244.2.0/24", "10.250.0.12")}
	plan, err := routes.Diff(desired, listAll(t, f))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, in := range plan.Report.Inside {
		got = append(got, in.String()+" in "+in.Range.String())
	}
	want := []string{"blackhole 10.244.0.128/26 proto boot in 10.244.0.0/24", "blackhole 10.244.2.64/26 proto boot in 10.244.2.0/24"}
	if !slices.Equal(got, want) {
		t.Errorf("inside:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(plan.Add) != 2 || len(plan.Report.Conflicts) != 0 {
		t.Errorf("plan %+v: the routes of ours go in regardless", plan)
	}
}

// A borrowed address (a StatefulSet pod's sticky address re-created on another
// node) follows its borrower on the block owner's node: the host route goes in
// beside the owner's unreachable block route, moves in place when the address
// moves on, and is deleted when the borrow ends, leaving the block's route alone.
func TestBorrowedAddressFollowsBorrower(t *testing.T) {
	nodes := []nodenet.Node{
		{Name: "a", Addrs: []netip.Addr{netip.MustParseAddr("10.250.0.11")}},
		{Name: "b", Addrs: []netip.Addr{netip.MustParseAddr("10.250.0.12")}},
		{Name: "c", Addrs: []netip.Addr{netip.MustParseAddr("10.250.0.13")}},
	}
	block := nodenet.Block{Prefix: pfx("10.96.0.0/26"), Owner: "a"}
	borrowed := func(node string) nodenet.Block {
		return nodenet.Block{Prefix: pfx("10.96.0.5/32"), Owner: node, Borrowed: true}
	}
	f := newFake()
	rec := routes.New(f)
	for _, step := range []struct {
		name   string
		blocks []nodenet.Block
		ops    []string
	}{
		{"borrowed by b", []nodenet.Block{block, borrowed("b")}, []string{"add 10.96.0.0/26 metric 0", "add 10.96.0.5/32 metric 0"}},
		{"moved on to c", []nodenet.Block{block, borrowed("c")}, []string{"replace 10.96.0.5/32 metric 0"}},
		{"borrow ended", []nodenet.Block{block}, []string{"del 10.96.0.5/32 metric 0"}},
	} {
		plan := nodenet.Desired("a", nodes, step.blocks)
		if len(plan.Problems) != 0 {
			t.Fatalf("%s: problems %v", step.name, plan.Problems)
		}
		if _, err := rec.Sync(plan.Routes); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if ops := f.takeOps(); !slices.Equal(ops, step.ops) {
			t.Errorf("%s: changes:\n%s\nwant:\n%s", step.name, strings.Join(ops, "\n"), strings.Join(step.ops, "\n"))
		}
		var got []string
		for _, r := range listAll(t, f) {
			if r.Protocol == routes.Protocol {
				gw := ""
				if r.Gw != nil {
					gw = " via " + r.Gw.String()
				}
				got = append(got, ipPrefix(r.Dst).String()+gw)
			}
		}
		t.Logf("%s: %v", step.name, got)
	}
	var left []string
	for _, r := range listAll(t, f) {
		left = append(left, ipPrefix(r.Dst).String())
	}
	if want := []string{"10.250.0.0/24", "10.96.0.0/26", "fd00:250::/64"}; !sameSet(left, want) {
		t.Errorf("table after the borrow ended: %v, want %v (no host route left behind)", left, want)
	}
}

func ipPrefix(n *net.IPNet) netip.Prefix {
	a, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones)
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
