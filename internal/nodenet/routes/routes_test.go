package routes_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/nodenet"
	"github.com/ipledger/ipledger/internal/nodenet/routes"
	"github.com/ipledger/ipledger/internal/testenv/netnodes"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func ip(s string) netip.Addr    { return netip.MustParseAddr(s) }

func via(dst, gw string) nodenet.Route {
	return nodenet.Route{Dst: pfx(dst), Via: ip(gw), Type: nodenet.Unicast}
}

func unreachable(dst string) nodenet.Route {
	return nodenet.Route{Dst: pfx(dst), Type: nodenet.Unreachable}
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// table lists the main table of node's namespace, one line per route: those
// of ipledger's protocol, and all the others.
func table(t *testing.T, node *netnodes.Host) (ours, others []string) {
	t.Helper()
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := node.Netlink.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			line := r.Dst.String()
			switch {
			case r.Type == unix.RTN_UNREACHABLE:
				line = "unreachable " + line
			case r.Gw != nil:
				l, err := node.Netlink.LinkByIndex(r.LinkIndex)
				if err != nil {
					t.Fatal(err)
				}
				line += fmt.Sprintf(" via %s dev %s", r.Gw, l.Attrs().Name)
			default:
				line += fmt.Sprintf(" dev%d", r.LinkIndex)
			}
			if r.Protocol == routes.Protocol {
				ours = append(ours, line)
			} else {
				others = append(others, fmt.Sprintf("%s proto %d metric %d", line, r.Protocol, r.Priority))
			}
		}
	}
	slices.Sort(ours)
	slices.Sort(others)
	return ours, others
}

// addRoute adds a route as another owner (or a past ipledger) would.
func addRoute(t *testing.T, node *netnodes.Host, dst, gw string, proto netlink.RouteProtocol, metric int) {
	t.Helper()
	eth, err := node.Netlink.LinkByName(node.Link)
	if err != nil {
		t.Fatal(err)
	}
	r := &netlink.Route{LinkIndex: eth.Attrs().Index, Dst: ipNet(pfx(dst)), Gw: ip(gw).AsSlice(), Protocol: proto, Priority: metric}
	if err := node.Netlink.RouteAdd(r); err != nil {
		t.Fatalf("add %s via %s proto %d: %v", dst, gw, proto, err)
	}
}

func TestSync(t *testing.T) {
	env := netnodes.New(t, 1)
	node := env.Node(0)
	defer func() {
		if t.Failed() {
			t.Log(node.Dump())
		}
	}()
	// Another owner's route, where ipledger will want one.
	addRoute(t, node, "10.244.9.0/24", "10.250.0.13", unix.RTPROT_STATIC, 0)
	// Routes of ours nobody wants any more (a deleted Node, a moved block),
	// and one of ours beside the other owner's.
	addRoute(t, node, "10.244.8.0/24", "10.250.0.13", routes.Protocol, 0)
	addRoute(t, node, "fd00:244:0:8::/64", "fd00:250::13", routes.Protocol, 0)
	addRoute(t, node, "10.244.9.0/24", "10.250.0.12", routes.Protocol, 10)
	_, othersBefore := table(t, node)

	rec := routes.New(node.Netlink)
	desired := []nodenet.Route{
		via("10.244.2.0/24", "10.250.0.12"),
		via("fd00:244:0:2::/64", "fd00:250::12"),
		via("10.244.9.0/24", "10.250.0.12"),
		// Reachable, but only through the default gateway: off-link.
		via("10.99.0.0/24", "192.0.2.1"),
		unreachable("10.96.0.0/26"),
		unreachable("fd00:96::/122"),
	}
	rep, err := rec.Sync(desired)
	if err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if rep.Installed != 4 || rep.Removed != 3 || rep.Unchanged != 0 {
		t.Errorf("first Sync: installed %d removed %d unchanged %d, want 4 3 0", rep.Installed, rep.Removed, rep.Unchanged)
	}
	wantConflicts := []routes.Conflict{{Dst: pfx("10.244.9.0/24"), Protocol: unix.RTPROT_STATIC, Dev: "eth0", Via: ip("10.250.0.13")}}
	if !slices.Equal(rep.Conflicts, wantConflicts) {
		t.Errorf("conflicts %v, want %v", rep.Conflicts, wantConflicts)
	}
	wantOffLink := []routes.OffLink{{Dst: pfx("10.99.0.0/24"), Via: ip("192.0.2.1")}}
	if !slices.Equal(rep.OffLink, wantOffLink) {
		t.Errorf("off-link %v, want %v", rep.OffLink, wantOffLink)
	}
	wantOurs := []string{
		"10.244.2.0/24 via 10.250.0.12 dev eth0",
		"fd00:244:0:2::/64 via fd00:250::12 dev eth0",
		"unreachable 10.96.0.0/26",
		"unreachable fd00:96::/122",
	}
	ours, others := table(t, node)
	if !slices.Equal(ours, wantOurs) {
		t.Errorf("routes of ours:\n%s\nwant:\n%s", strings.Join(ours, "\n"), strings.Join(wantOurs, "\n"))
	}
	if !slices.Equal(others, othersBefore) {
		t.Errorf("other routes changed:\n%s\nbefore:\n%s", strings.Join(others, "\n"), strings.Join(othersBefore, "\n"))
	}

	// The same input again: nothing to do.
	rep2, err := rec.Sync(desired)
	if err != nil {
		t.Fatalf("second Sync: %v", err)
	}
	if rep2.Installed != 0 || rep2.Removed != 0 || rep2.Unchanged != 4 {
		t.Errorf("second Sync: installed %d removed %d unchanged %d, want 0 0 4", rep2.Installed, rep2.Removed, rep2.Unchanged)
	}
	if !slices.Equal(rep2.Conflicts, wantConflicts) || !slices.Equal(rep2.OffLink, wantOffLink) {
		t.Errorf("second Sync: conflicts %v off-link %v", rep2.Conflicts, rep2.OffLink)
	}
	if again, _ := table(t, node); !slices.Equal(again, ours) {
		t.Errorf("second Sync changed routes: %v", again)
	}

	// Blocks move: next hops change, unreachable becomes unicast and back,
	// in both families; Check first reports it without doing it.
	moved := []nodenet.Route{
		via("10.244.2.0/24", "10.250.0.13"),
		unreachable("fd00:244:0:2::/64"),
		via("10.96.0.0/26", "10.250.0.12"),
		via("fd00:96::/122", "fd00:250::13"),
	}
	crep, err := rec.Check(moved)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if crep.Installed != 4 || crep.Removed != 0 || crep.Unchanged != 0 || crep.Conflicts != nil || crep.OffLink != nil {
		t.Errorf("Check: %+v, want 4 to install", crep)
	}
	if again, _ := table(t, node); !slices.Equal(again, ours) {
		t.Errorf("Check changed routes: %v", again)
	}
	rep3, err := rec.Sync(moved)
	if err != nil {
		t.Fatalf("Sync moved: %v", err)
	}
	if rep3.Installed != 4 || rep3.Removed != 0 || rep3.Unchanged != 0 {
		t.Errorf("Sync moved: %+v", rep3)
	}
	wantMoved := []string{
		"10.244.2.0/24 via 10.250.0.13 dev eth0",
		"10.96.0.0/26 via 10.250.0.12 dev eth0",
		"fd00:96::/122 via fd00:250::13 dev eth0",
		"unreachable fd00:244:0:2::/64",
	}
	ours, others = table(t, node)
	if !slices.Equal(ours, wantMoved) {
		t.Errorf("routes of ours after the move:\n%s\nwant:\n%s", strings.Join(ours, "\n"), strings.Join(wantMoved, "\n"))
	}
	if !slices.Equal(others, othersBefore) {
		t.Errorf("other routes changed by the move:\n%s", strings.Join(others, "\n"))
	}
	if rep4, err := rec.Sync(moved); err != nil || rep4.Installed != 0 || rep4.Removed != 0 || rep4.Unchanged != 4 {
		t.Errorf("Sync moved again: %+v, %v", rep4, err)
	}

	// Uninstall: every route of ours goes, nothing else.
	n, err := rec.Remove()
	if err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if n != 4 {
		t.Errorf("Remove removed %d, want 4", n)
	}
	ours, others = table(t, node)
	if len(ours) != 0 {
		t.Errorf("routes of ours left after Remove: %v", ours)
	}
	if !slices.Equal(others, othersBefore) {
		t.Errorf("Remove changed other routes:\n%s\nbefore:\n%s", strings.Join(others, "\n"), strings.Join(othersBefore, "\n"))
	}
	if n, err := rec.Remove(); err != nil || n != 0 {
		t.Errorf("second Remove: %d, %v", n, err)
	}
}

func TestSyncInvalid(t *testing.T) {
	env := netnodes.New(t, 1)
	node := env.Node(0)
	rec := routes.New(node.Netlink)
	rep, err := rec.Sync([]nodenet.Route{
		via("10.244.2.0/24", "10.250.0.12"),
		{Dst: pfx("10.244.3.0/24"), Type: nodenet.Unicast},      // no next hop
		via("10.244.4.0/24", "fd00:250::12"),                    // wrong family
		via("10.244.2.0/24", "10.250.0.13"),                     // asked twice
		{Dst: pfx("10.244.5.0/24"), Type: nodenet.RouteType(9)}, // unknown type
	})
	if !errors.Is(err, routes.ErrInvalidRoute) {
		t.Errorf("Sync: %v, want ErrInvalidRoute", err)
	}
	if rep.Installed != 1 {
		t.Errorf("installed %d, want the one valid route", rep.Installed)
	}
	ours, _ := table(t, node)
	if want := []string{"10.244.2.0/24 via 10.250.0.12 dev eth0"}; !slices.Equal(ours, want) {
		t.Errorf("routes of ours %v, want %v", ours, want)
	}
}
