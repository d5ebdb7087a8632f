package bench

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
)

// TestMainPluginStaysOffTheHost: the main-plugin step's plugins set up their
// host sides (veths, /32 routes, ptp's ip_forward) in a node namespace of the
// step's own. On the caller's namespace, the host, no route of the step's
// subnets and no veth of its network appears while it runs: another test's
// node may run there, and the step once wrote the host's ip_forward back to 0
// behind ptp, which turns forwarding off on every interface of the host.
func TestMainPluginStaysOffTheHost(t *testing.T) {
	done := make(chan struct{})
	routes := make(chan netlink.RouteUpdate, 256)
	links := make(chan netlink.LinkUpdate, 256)
	if err := netlink.RouteSubscribe(routes, done); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSubscribe(links, done); err != nil {
		close(done)
		t.Fatal(err)
	}
	var seen []string
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		nets := []*net.IPNet{}
		for _, s := range []string{subnetVethIPL, subnetVethPTP} {
			_, n, _ := net.ParseCIDR(s)
			nets = append(nets, n)
		}
		for routes != nil || links != nil {
			select {
			case u, ok := <-routes:
				if !ok {
					routes = nil
					continue
				}
				for _, n := range nets {
					if u.Dst != nil && n.Contains(u.Dst.IP) {
						seen = append(seen, "route "+u.Route.String())
					}
				}
			case u, ok := <-links:
				if !ok {
					links = nil
					continue
				}
				if a := u.Attrs().Alias; strings.Contains(a, "net="+vethNetIPL+" ") {
					seen = append(seen, "link "+u.Attrs().Name+" ("+a+")")
				}
			}
		}
	}()
	rep, err := Run(context.Background(), Options{Smoke: true, TB: t, Log: ledgertest.TestLogger(t), Steps: []string{"main-plugin"}})
	close(done)
	<-watched
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := rep.Find(groupMain, "ADD p50"); !ok {
		t.Errorf("no %s / ADD p50 row: the step measured nothing", groupMain)
	}
	for _, s := range seen {
		t.Errorf("the main-plugin step touched the caller's namespace: %s", s)
	}
}
