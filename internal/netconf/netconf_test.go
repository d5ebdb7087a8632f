package netconf_test

import (
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/netconf"
	"github.com/ipledger/ipledger/internal/nsenter"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
	"github.com/ipledger/ipledger/internal/testenv/netnodes"
)

// TestDefaultNodeIPs: a node's default address of each family is the source of
// its default route (netnodes' nodes route to outside through eth0); a namespace
// without a default route has none, and says to give --node-ip.
func TestDefaultNodeIPs(t *testing.T) {
	env := netnodes.New(t, 1)
	n := env.Node(0)
	got, err := netconf.DefaultNodeIPs(n.Netlink)
	if err != nil {
		t.Fatal(err)
	}
	if want := n.Addrs(); !slices.Equal(got, want) {
		t.Fatalf("DefaultNodeIPs in %s = %v, want %v (eth0's)", n.Name, got, want)
	}

	empty := netenv.Namespace(t, "iplnc")
	ns, err := os.Open(empty.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := nsenter.Handle(int(ns.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if got, err := netconf.DefaultNodeIPs(h); err == nil || !strings.Contains(err.Error(), "--node-ip") {
		t.Fatalf("DefaultNodeIPs without a default route = %v, %v; want an error naming --node-ip", got, err)
	}
}

func TestParseNodeIPs(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []netip.Addr
		err  string
	}{
		{"10.0.0.11", []netip.Addr{netip.MustParseAddr("10.0.0.11")}, ""},
		{" 10.0.0.11 , fd00::11", []netip.Addr{netip.MustParseAddr("10.0.0.11"), netip.MustParseAddr("fd00::11")}, ""},
		{"fd00::11", []netip.Addr{netip.MustParseAddr("fd00::11")}, ""},
		{"::ffff:10.0.0.11", []netip.Addr{netip.MustParseAddr("10.0.0.11")}, ""},
		{"10.0.0.11,10.0.0.12", nil, "at most one address per family"},
		{"", nil, "no address given"},
		{"node-a", nil, "is not an IP address"},
		{"fe80::1%eth0", nil, "is not an IP address"},
		{"0.0.0.0", nil, "unicast address"},
		{"127.0.0.1", nil, "unicast address"},
		{"fe80::1", nil, "unicast address"},
	} {
		got, err := netconf.ParseNodeIPs(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseNodeIPs(%q) = %v, %v; want an error with %q", c.in, got, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("ParseNodeIPs(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
}
