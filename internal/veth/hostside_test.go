package veth_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
	"github.com/ipledger/ipledger/internal/veth"
	"github.com/vishvananda/netlink"
)

// ipNS runs `ip -n NS args...` on the namespace at nsPath (a /run/netns path).
func ipNS(t *testing.T, nsPath string, args ...string) {
	t.Helper()
	full := append([]string{"-n", filepath.Base(nsPath)}, args...)
	if out, err := exec.Command("ip", full...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v %s", strings.Join(full, " "), err, out)
	}
}

// sysctl reads /proc/sys/net/PATH inside the namespace at nsPath.
func sysctl(t *testing.T, nsPath, path string) string {
	t.Helper()
	var v string
	inNS(t, nsPath, func() error {
		b, err := os.ReadFile("/proc/sys/net/" + path)
		v = strings.TrimSpace(string(b))
		return err
	})
	return v
}

// addInNode runs ADD of list for a pod namespace of its own through libcni with
// the node namespace as the host, and DEL in t.Cleanup.
func addInNode(t *testing.T, node string, list *libcni.NetworkConfigList, containerID string) (pod string, res *current.Result) {
	t.Helper()
	pod = netenv.Namespace(t, "iplt-pod").Path
	cni := newCNI(t)
	rt := &libcni.RuntimeConf{ContainerID: containerID, NetNS: pod, IfName: "eth0"}
	inNS(t, node, func() error {
		r, err := cni.AddNetworkList(context.Background(), list, rt)
		if err != nil {
			return fmt.Errorf("ADD: %w", err)
		}
		res, err = current.NewResultFromResult(r)
		return err
	})
	t.Cleanup(func() {
		inNS(t, node, func() error { return cni.DelNetworkList(context.Background(), list, rt) })
	})
	return pod, res
}

// plainList is a conflist of ipledger-veth alone with host-local IPv4 addresses,
// plugin fields from extra.
func plainList(t *testing.T, network string, dualStack bool, extra map[string]any) *libcni.NetworkConfigList {
	t.Helper()
	plugin := map[string]any{"type": pluginType, "ipam": (&hostLocal{dataDir: t.TempDir()}).Section(pool{idx: 0}, dualStack, false)}
	for k, v := range extra {
		plugin[k] = v
	}
	return listOf(t, "1.0.0", network, plugin)
}

// TestMTUFromDefaultRoute: without an mtu in the config, both veth ends get the
// MTU of the interface of the host namespace's default route (IPv4 first, the
// lowest metric), an explicit mtu wins, and with no default route they keep
// veth.DefaultMTU. The host is a namespace the test made.
func TestMTUFromDefaultRoute(t *testing.T) {
	type uplink struct {
		name string
		mtu  int
	}
	cases := []struct {
		name    string
		uplinks []uplink
		setup   [][]string
		extra   map[string]any
		want    int
	}{
		{"ipv4-default-route", []uplink{{"up0", 1400}}, [][]string{
			{"addr", "add", "10.251.0.1/24", "dev", "up0"}, {"route", "add", "default", "via", "10.251.0.254", "dev", "up0"},
		}, nil, 1400},
		{"ipv6-default-route-only", []uplink{{"up0", 1380}}, [][]string{
			{"-6", "route", "add", "default", "dev", "up0"},
		}, nil, 1380},
		{"ipv4-before-ipv6", []uplink{{"up0", 1400}, {"up1", 1300}}, [][]string{
			{"route", "add", "default", "dev", "up0"}, {"-6", "route", "add", "default", "dev", "up1"},
		}, nil, 1400},
		{"lowest-metric", []uplink{{"up0", 1400}, {"up1", 1450}}, [][]string{
			{"route", "add", "default", "dev", "up0", "metric", "200"}, {"route", "add", "default", "dev", "up1", "metric", "100"},
		}, nil, 1450},
		// The route lookup of the documentation addresses the plugin tries first
		// meets more specific routes: it lists the tables instead.
		{"probe-routed-elsewhere", []uplink{{"up0", 1400}, {"up1", 1300}}, [][]string{
			{"route", "add", "default", "dev", "up0", "metric", "300"}, {"route", "add", "203.0.113.0/24", "dev", "up1"},
			{"-6", "route", "add", "2001:db8::/32", "dev", "up1"},
		}, nil, 1400},
		{"ipv6-probe-routed-elsewhere", []uplink{{"up0", 1380}, {"up1", 1300}}, [][]string{
			{"-6", "route", "add", "default", "dev", "up0"}, {"-6", "route", "add", "2001:db8::/32", "dev", "up1"},
		}, nil, 1380},
		{"explicit-mtu-wins", []uplink{{"up0", 1400}}, [][]string{
			{"route", "add", "default", "dev", "up0"},
		}, map[string]any{"mtu": 1300}, 1300},
		{"no-default-route", []uplink{{"up0", 1400}}, [][]string{
			{"addr", "add", "10.251.0.1/24", "dev", "up0"},
		}, nil, veth.DefaultMTU},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			node := netenv.Namespace(t, "iplt-node").Path
			// A veth pair inside the node namespace stands for each uplink (the
			// kernel may lack the dummy driver).
			for _, u := range c.uplinks {
				mtu := fmt.Sprint(u.mtu)
				ipNS(t, node, "link", "add", u.name, "mtu", mtu, "type", "veth", "peer", "name", u.name+"p", "mtu", mtu)
				ipNS(t, node, "link", "set", u.name+"p", "up")
				ipNS(t, node, "link", "set", u.name, "up")
			}
			for _, args := range c.setup {
				ipNS(t, node, args...)
			}
			network := "iplt-mtu"
			cid := "mtu-" + c.name
			pod, res := addInNode(t, node, plainList(t, network, false, c.extra), cid)
			for _, i := range res.Interfaces {
				if i.Mtu != c.want {
					t.Errorf("result interface %s mtu %d, want %d", i.Name, i.Mtu, c.want)
				}
			}
			hostName := veth.HostVethName(veth.DefaultHostVethPrefix, network, cid, "eth0")
			for _, side := range []struct{ ns, name string }{{node, hostName}, {pod, "eth0"}} {
				inNS(t, side.ns, func() error {
					l, err := netlink.LinkByName(side.name)
					if err != nil {
						return err
					}
					if l.Attrs().MTU != c.want {
						return fmt.Errorf("%s mtu %d, want %d", side.name, l.Attrs().MTU, c.want)
					}
					return nil
				})
			}
		})
	}
}

// TestHostVethSysctls: each host-side veth gets IPv4 forwarding, proxy ARP, a
// loose rp_filter (2) and IPv6 forwarding, on that interface only: the node's
// all and default keys keep what they had (a strict rp_filter of 1 here, as
// distributions set it).
func TestHostVethSysctls(t *testing.T) {
	node := netenv.Namespace(t, "iplt-node").Path
	global := map[string]string{
		"ipv4/conf/all/rp_filter": "1", "ipv4/conf/default/rp_filter": "1",
		"ipv4/conf/all/forwarding": "0", "ipv4/conf/default/forwarding": "0",
		"ipv4/conf/all/proxy_arp": "0", "ipv4/conf/default/proxy_arp": "0",
		"ipv6/conf/default/forwarding": "0",
	}
	inNS(t, node, func() error {
		for k, v := range global {
			if err := os.WriteFile("/proc/sys/net/"+k, []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	network := "iplt-sysctl"
	addInNode(t, node, plainList(t, network, true, nil), "sysctl")
	name := veth.HostVethName(veth.DefaultHostVethPrefix, network, "sysctl", "eth0")
	for k, want := range map[string]string{
		"ipv4/conf/" + name + "/forwarding": "1", "ipv4/conf/" + name + "/proxy_arp": "1",
		"ipv4/conf/" + name + "/rp_filter": "2", "ipv6/conf/" + name + "/forwarding": "1",
	} {
		if got := sysctl(t, node, k); got != want {
			t.Errorf("net.%s = %s, want %s", strings.ReplaceAll(k, "/", "."), got, want)
		}
	}
	for k, want := range global {
		if got := sysctl(t, node, k); got != want {
			t.Errorf("net.%s = %s, was %s before the ADD: a node-wide sysctl was changed", strings.ReplaceAll(k, "/", "."), got, want)
		}
	}
}

// TestHostRouteReplacesNodeRoute: a sticky address moves between nodes, and
// the node network's route of it to the node that held it before (protocol
// 201) may still be in the main table when the pod's ADD comes (seen in
// test/multinode's TestStickyStatefulSet under make test's load). ADD puts the
// pod's host route in its place; a route of another protocol is another
// owner's, and ADD fails on it, leaving it.
func TestHostRouteReplacesNodeRoute(t *testing.T) {
	for _, c := range []struct {
		proto string
		ok    bool
	}{{"201", true}, {"static", false}} {
		t.Run("proto-"+c.proto, func(t *testing.T) {
			node := netenv.Namespace(t, "iplt-node").Path
			ipNS(t, node, "link", "add", "up0", "type", "veth", "peer", "name", "up0p")
			ipNS(t, node, "link", "set", "up0p", "up")
			ipNS(t, node, "link", "set", "up0", "up")
			ipNS(t, node, "addr", "add", "10.251.0.1/24", "dev", "up0")
			// the first address of plainList's pool, routed to another node
			ipNS(t, node, "route", "add", "10.250.0.2/32", "via", "10.251.0.12", "dev", "up0", "proto", c.proto)
			network, cid := "iplt-stale", "stale-"+c.proto
			list := plainList(t, network, false, nil)
			if !c.ok {
				pod := netenv.Namespace(t, "iplt-pod").Path
				var err error
				inNS(t, node, func() error {
					_, err = newCNI(t).AddNetworkList(context.Background(), list, &libcni.RuntimeConf{ContainerID: cid, NetNS: pod, IfName: "eth0"})
					return nil
				})
				if err == nil || !strings.Contains(err.Error(), "host route 10.250.0.2/32") {
					t.Fatalf("ADD over a route of protocol %s: %v, want the host route's error", c.proto, err)
				}
				inNS(t, node, func() error {
					return newCNI(t).DelNetworkList(context.Background(), list, &libcni.RuntimeConf{ContainerID: cid, NetNS: pod, IfName: "eth0"})
				})
			} else {
				_, res := addInNode(t, node, list, cid)
				if got := res.IPs[0].Address.IP.String(); got != "10.250.0.2" {
					t.Fatalf("pod address %s, want 10.250.0.2 (the routed one)", got)
				}
			}
			var rs []netlink.Route
			inNS(t, node, func() error {
				var err error
				rs, err = netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: &net.IPNet{IP: net.ParseIP("10.250.0.2").To4(), Mask: net.CIDRMask(32, 32)}}, netlink.RT_FILTER_DST)
				return err
			})
			hostName := veth.HostVethName(veth.DefaultHostVethPrefix, network, cid, "eth0")
			if len(rs) != 1 {
				t.Fatalf("routes to 10.250.0.2: %v, want one", rs)
			}
			if c.ok {
				var l netlink.Link
				inNS(t, node, func() (err error) { l, err = netlink.LinkByName(hostName); return err })
				if rs[0].LinkIndex != l.Attrs().Index || rs[0].Gw != nil {
					t.Fatalf("route to 10.250.0.2: %v, want dev %s (the pod's host route)", rs[0], hostName)
				}
			} else if rs[0].Gw.String() != "10.251.0.12" {
				t.Fatalf("route to 10.250.0.2: %v, want the other owner's via 10.251.0.12, left alone", rs[0])
			}
		})
	}
}
