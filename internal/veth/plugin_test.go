package veth_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
	"github.com/ipledger/ipledger/internal/veth"
	"github.com/vishvananda/netlink"
)

// TestConnectivityThroughNode: two pods attached inside a test-made "node"
// namespace reach each other through it over IPv4 and IPv6, then DEL leaves the
// node clean. IPv6 forwarding is the one namespace-global setting, and it is set
// in the node namespace only; IPv4 needs none (per-interface forwarding).
func TestConnectivityThroughNode(t *testing.T) {
	for i, k := range ipamKinds {
		t.Run(k.name, func(t *testing.T) {
			ipam := k.new(t)
			node := netenv.Namespace(t, "iplt-node").Path
			podA, podB := netenv.Namespace(t, "iplt-a").Path, netenv.Namespace(t, "iplt-b").Path
			// A new namespace inherits the host's net.ipv4.conf.all.forwarding (on on
			// every Kubernetes node and Docker host). What the plugin must not do is
			// change it: the node namespace (ours, not the host's) starts with it off,
			// so a plugin turning it on is seen whatever the host's setting, and the
			// value after the ADDs is compared with the value before.
			var fwdBefore string
			inNS(t, node, func() error {
				if err := os.WriteFile("/proc/sys/net/ipv4/conf/all/forwarding", []byte("0"), 0o644); err != nil {
					return err
				}
				b, err := os.ReadFile("/proc/sys/net/ipv4/conf/all/forwarding")
				fwdBefore = strings.TrimSpace(string(b))
				if err != nil {
					return err
				}
				return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644)
			})
			network := "iplt-conn"
			list := confList(t, "1.1.0", network, ipam.Section(pool{idx: 1 + i}, true, false))
			cni := newCNI(t)
			ctx := context.Background()
			rtA := &libcni.RuntimeConf{ContainerID: "conn-a", NetNS: podA, IfName: "eth0"}
			rtB := &libcni.RuntimeConf{ContainerID: "conn-b", NetNS: podB, IfName: "eth0"}
			var resA, resB types.Result
			inNS(t, node, func() error {
				var err error
				if resA, err = cni.AddNetworkList(ctx, list, rtA); err != nil {
					return fmt.Errorf("ADD a: %w", err)
				}
				if resB, err = cni.AddNetworkList(ctx, list, rtB); err != nil {
					return fmt.Errorf("ADD b: %w", err)
				}
				return nil
			})
			ipsA, ipsB := ipsOf(t, resA), ipsOf(t, resB)
			if len(ipsA) != 2 || len(ipsB) != 2 {
				t.Fatalf("want dual-stack results, got %v and %v", ipsA, ipsB)
			}
			for j := range ipsA {
				ping(t, podA, ipsB[j])
				ping(t, podB, ipsA[j])
			}
			// The pod side: loopback up, host-length addresses, default routes through
			// the link-local gateways.
			inNS(t, podA, func() error {
				lo, err := netlink.LinkByName("lo")
				if err != nil || lo.Attrs().Flags&net.FlagUp == 0 {
					return fmt.Errorf("pod lo not up: %v", err)
				}
				eth0, err := netlink.LinkByName("eth0")
				if err != nil {
					return err
				}
				addrs, err := netlink.AddrList(eth0, netlink.FAMILY_ALL)
				if err != nil {
					return err
				}
				hostLen := 0
				for _, a := range addrs {
					if ones, bits := a.Mask.Size(); a.IP.IsGlobalUnicast() && ones == bits {
						hostLen++
					}
				}
				if hostLen != 2 {
					return fmt.Errorf("pod eth0 addresses %v, want one /32 and one /128", addrs)
				}
				gws := map[string]bool{}
				routes, err := netlink.RouteList(eth0, netlink.FAMILY_ALL)
				if err != nil {
					return err
				}
				for _, r := range routes {
					if (r.Dst == nil || r.Dst.IP.IsUnspecified()) && r.Gw != nil {
						gws[r.Gw.String()] = true
					}
				}
				if !gws[veth.GatewayV4.String()] || !gws[veth.GatewayV6.String()] {
					return fmt.Errorf("pod default routes via %v, want via %s and %s", gws, veth.GatewayV4, veth.GatewayV6)
				}
				return nil
			})
			// The node side: proxy ARP and the IPv6 gateway on the pod's veth only;
			// the node's global IPv4 forwarding untouched.
			inNS(t, node, func() error {
				name := veth.HostVethName("ipl", network, "conn-a", "eth0")
				b, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + name + "/proxy_arp")
				if err != nil || strings.TrimSpace(string(b)) != "1" {
					return fmt.Errorf("proxy_arp on %s = %q (%v), want 1", name, b, err)
				}
				if b, err := os.ReadFile("/proc/sys/net/ipv4/conf/all/forwarding"); err != nil || strings.TrimSpace(string(b)) != fwdBefore {
					return fmt.Errorf("node's net.ipv4.conf.all.forwarding = %q (%v), was %q before the ADDs: a global sysctl was changed", b, err, fwdBefore)
				}
				l, err := netlink.LinkByName(name)
				if err != nil {
					return err
				}
				addrs, err := netlink.AddrList(l, netlink.FAMILY_V6)
				if err != nil {
					return err
				}
				for _, a := range addrs {
					if a.IP.Equal(veth.GatewayV6) {
						return nil
					}
				}
				return fmt.Errorf("host veth %s addresses %v lack the gateway %s", name, addrs, veth.GatewayV6)
			})
			inNS(t, node, func() error {
				if err := cni.CheckNetworkList(ctx, list, rtA); err != nil {
					return fmt.Errorf("CHECK a: %w", err)
				}
				if err := cni.DelNetworkList(ctx, list, rtA); err != nil {
					return fmt.Errorf("DEL a: %w", err)
				}
				if err := cni.DelNetworkList(ctx, list, rtB); err != nil {
					return fmt.Errorf("DEL b: %w", err)
				}
				links, err := netlinksafe.LinkList()
				if err != nil {
					return err
				}
				for _, l := range links {
					if l.Attrs().Name != "lo" {
						return fmt.Errorf("node namespace still has %s after DEL", l.Attrs().Name)
					}
				}
				return nil
			})
			if l := ipam.Leases(t, network); len(l) != 0 {
				t.Fatalf("leases left after DEL: %v", l)
			}
		})
	}
}

// TestDelNeverTouchesNetNS: DEL with a CNI_NETNS that is the host's, the test
// process's own, gone, or empty removes only the pod's veth, releases the lease and
// leaves the host's lo up and every other host interface as it was.
func TestDelNeverTouchesNetNS(t *testing.T) {
	for i, k := range ipamKinds {
		t.Run(k.name, func(t *testing.T) {
			// A /proc/PID/ns/net of a process that has exited, as after a reboot.
			exited := exec.Command("true")
			if err := exited.Run(); err != nil {
				t.Fatal(err)
			}
			gone := fmt.Sprintf("/proc/%d/ns/net", exited.Process.Pid)
			cases := []struct{ name, netns string }{
				{"proc1", "/proc/1/ns/net"},
				{"test-process", fmt.Sprintf("/proc/%d/ns/net", os.Getpid())},
				{"plugin-self", "/proc/self/ns/net"},
				{"exited-pid", gone},
				{"no-such-file", "/run/netns/iplt-never-created"},
				{"empty", ""},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					ipam := k.new(t)
					network := "iplt-del"
					cleanupNetwork(t, network)
					pod := netenv.Namespace(t, "iplt-del").Path
					conf := confBytes(t, "1.0.0", network, ipam.Section(pool{idx: 2 + i}, true, false), nil)
					cid := "del-" + c.name
					hostName := veth.HostVethName(veth.DefaultHostVethPrefix, network, cid, "eth0")
					add := execPlugin(t, "ADD", cid, pod, "eth0", conf)
					add.ok(t)
					ips := resultIPs(t, add.stdout)
					if got := ipam.Leases(t, network); !slices.Equal(got, strs(ips)) {
						t.Fatalf("leases %v, result %v", got, strs(ips))
					}
					if _, err := netlink.LinkByName(hostName); err != nil {
						t.Fatalf("host veth %s: %v", hostName, err)
					}
					before := hostLinks(t)
					loBefore := loFlags(t)
					if loBefore&net.FlagUp == 0 {
						t.Fatal("host lo is down before the test")
					}
					execPlugin(t, "DEL", cid, c.netns, "eth0", conf).ok(t)
					if loFlags(t) != loBefore {
						t.Fatalf("host lo flags %v, were %v", loFlags(t), loBefore)
					}
					after := hostLinks(t)
					want := slices.DeleteFunc(slices.Clone(before), func(l linkState) bool { return l.Name == hostName })
					if len(want) != len(before)-1 || !slices.Equal(after, want) {
						t.Fatalf("host links after DEL:\n%v\nwant:\n%v", after, want)
					}
					for _, ip := range ips {
						if rs := routesTo(t, ip); len(rs) != 0 {
							t.Fatalf("host routes to %s left: %v", ip, rs)
						}
					}
					if l := ipam.Leases(t, network); len(l) != 0 {
						t.Fatalf("leases left after DEL: %v", l)
					}
					// The pod's namespace was not entered but its end went with the pair.
					inNS(t, pod, func() error {
						if _, err := netlink.LinkByName("eth0"); err == nil {
							return fmt.Errorf("pod eth0 still exists")
						}
						return nil
					})
					// DEL of something already gone succeeds.
					execPlugin(t, "DEL", cid, c.netns, "eth0", conf).ok(t)
				})
			}
		})
	}
}

// TestDelReleasesUnroutedAddress: DEL takes the host route to the pod's address away
// before the IPAM plugin releases the address (its release runs while the kernel
// tears the veth down), so a released address is never routed to the old veth; the
// veth is gone when DEL answers. The IPAM plugin here is a script that records the
// host's routes at the moment of the release.
func TestDelReleasesUnroutedAddress(t *testing.T) {
	network := "iplt-order"
	cleanupNetwork(t, network)
	pod := netenv.Namespace(t, "iplt-order").Path
	conf := confBytes(t, "1.0.0", network, map[string]any{"type": "routecheck-ipam"}, nil)
	cid := "order-1"
	hostName := veth.HostVethName(veth.DefaultHostVethPrefix, network, cid, "eth0")
	execPlugin(t, "ADD", cid, pod, "eth0", conf).ok(t)
	ip := net.ParseIP("10.250.0.250").To4()
	if rs := routesTo(t, ip); len(rs) != 1 {
		t.Fatalf("after ADD, host routes to %s: %v, want one", ip, rs)
	}
	logPath := filepath.Join(binDir, "routecheck-ipam.log")
	os.Remove(logPath)
	execPlugin(t, "DEL", cid, pod, "eth0", conf).ok(t)
	if got, want := readFile(t, logPath), "DEL "+cid+"\nEND\n"; got != want {
		t.Fatalf("at the IPAM release the host still routed the address:\n%s\nwant:\n%s", got, want)
	}
	if _, err := netlink.LinkByName(hostName); err == nil {
		t.Fatalf("host veth %s still there after DEL", hostName)
	}
	if rs := routesTo(t, ip); len(rs) != 0 {
		t.Fatalf("host routes to %s left: %v", ip, rs)
	}
}

// TestAddRefusesHostNetNS: ADD into the host's or the plugin's own namespace is
// refused with ErrInvalidNetNS and leaves no veth and no lease.
func TestAddRefusesHostNetNS(t *testing.T) {
	for i, k := range ipamKinds {
		t.Run(k.name, func(t *testing.T) {
			for _, nsPath := range []string{"/proc/1/ns/net", fmt.Sprintf("/proc/%d/ns/net", os.Getpid()), "/proc/self/ns/net", "/proc/thread-self/ns/net"} {
				t.Run(strings.ReplaceAll(nsPath, "/", "_"), func(t *testing.T) {
					ipam := k.new(t)
					network := "iplt-refuse"
					cleanupNetwork(t, network)
					conf := confBytes(t, "1.0.0", network, ipam.Section(pool{idx: 3 + i}, true, false), nil)
					before := hostLinks(t)
					e := execPlugin(t, "ADD", "refuse", nsPath, "eth0", conf).cniError(t)
					// The namespaces of this process are refused by identity. /proc/1's may
					// not even be openable (here: permission denied, pid 1 is outside this
					// sandbox's reach); then it is refused as not usable, still code 8.
					want := "host's or the plugin's own network namespace"
					if nsPath == "/proc/1/ns/net" && strings.Contains(e.Msg, "not a network namespace") {
						want = "/proc/1/ns/net"
					}
					if e.Code != types.ErrInvalidNetNS || !strings.Contains(e.Msg, want) {
						t.Fatalf("error code %d %q, want code %d with %q", e.Code, e.Msg, types.ErrInvalidNetNS, want)
					}
					if after := hostLinks(t); linksChanged(before, after) {
						t.Fatalf("host links changed:\n%v\n%v", before, after)
					}
					if l := ipam.Leases(t, network); len(l) != 0 {
						t.Fatalf("leases after refused ADD: %v", l)
					}
				})
			}
		})
	}
}

// TestAddFailureLeavesNothing: an ADD that fails at any step leaves no veth, no
// route and no lease.
func TestAddFailureLeavesNothing(t *testing.T) {
	for i, k := range ipamKinds {
		t.Run(k.name, func(t *testing.T) {
			p := pool{idx: 4 + i}
			t.Run("ipam-exhausted", func(t *testing.T) {
				ipam := k.new(t)
				network := "iplt-exh"
				cleanupNetwork(t, network)
				conf := confBytes(t, "1.0.0", network, ipam.Section(p, false, true), nil)
				first := netenv.Namespace(t, "iplt-exh").Path
				execPlugin(t, "ADD", "exh-1", first, "eth0", conf).ok(t)
				held := ipam.Leases(t, network)
				before := hostLinks(t)
				second := netenv.Namespace(t, "iplt-exh").Path
				e := execPlugin(t, "ADD", "exh-2", second, "eth0", conf).cniError(t)
				// IPAM's own error reaches the runtime unchanged: code and message.
				wantCode, wantMsg := uint(types.ErrInternal), "no IP addresses available"
				if k.name == "ipledger" {
					wantCode, wantMsg = 100, `pool exhausted: network "`+network+`"`
				}
				if e.Code != wantCode || !strings.Contains(e.Msg, wantMsg) {
					t.Fatalf("exhausted: code %d %q, want code %d with %q", e.Code, e.Msg, wantCode, wantMsg)
				}
				if after := hostLinks(t); linksChanged(before, after) {
					t.Fatalf("host links changed:\n%v\n%v", before, after)
				}
				if got := ipam.Leases(t, network); !slices.Equal(got, held) {
					t.Fatalf("leases %v, want only %v", got, held)
				}
				execPlugin(t, "DEL", "exh-1", first, "eth0", conf).ok(t)
			})
			t.Run("ifname-exists-in-pod", func(t *testing.T) {
				// Fails creating the veth, after IPAM ADD: the lease must be released.
				ipam := k.new(t)
				network := "iplt-exists"
				cleanupNetwork(t, network)
				pod := netenv.Namespace(t, "iplt-exists").Path
				inNS(t, pod, func() error {
					return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0peer"})
				})
				conf := confBytes(t, "1.0.0", network, ipam.Section(p, true, false), nil)
				before := hostLinks(t)
				e := execPlugin(t, "ADD", "exists", pod, "eth0", conf).cniError(t)
				if e.Code != types.ErrInternal || !strings.Contains(e.Msg, "create veth") || !strings.Contains(e.Msg, "file exists") {
					t.Fatalf("exists: code %d %q, want code %d naming the veth creation", e.Code, e.Msg, types.ErrInternal)
				}
				if after := hostLinks(t); linksChanged(before, after) {
					t.Fatalf("host links changed:\n%v\n%v", before, after)
				}
				if l := ipam.Leases(t, network); len(l) != 0 {
					t.Fatalf("leases after failed ADD: %v", l)
				}
				inNS(t, pod, func() error {
					l, err := netlink.LinkByName("eth0")
					if err != nil || l.Attrs().Alias != "" || l.Attrs().Flags&net.FlagUp != 0 {
						return fmt.Errorf("pod's own eth0 was touched: %v %v", l, err)
					}
					return nil
				})
			})
			t.Run("pod-ipv6-disabled", func(t *testing.T) {
				// Fails configuring the pod after the veth exists: veth, routes and lease go.
				ipam := k.new(t)
				network := "iplt-nov6"
				cleanupNetwork(t, network)
				pod := netenv.Namespace(t, "iplt-nov6").Path
				inNS(t, pod, func() error {
					for _, f := range []string{"all", "default"} {
						if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+f+"/disable_ipv6", []byte("1"), 0o644); err != nil {
							return err
						}
					}
					return nil
				})
				conf := confBytes(t, "1.0.0", network, ipam.Section(p, true, false), nil)
				before := hostLinks(t)
				e := execPlugin(t, "ADD", "nov6", pod, "eth0", conf).cniError(t)
				if e.Code != types.ErrInternal || !strings.Contains(e.Msg, "pod address fd00:") {
					t.Fatalf("nov6: code %d %q, want code %d naming the pod's IPv6 address", e.Code, e.Msg, types.ErrInternal)
				}
				if after := hostLinks(t); linksChanged(before, after) {
					t.Fatalf("host links changed:\n%v\n%v", before, after)
				}
				if l := ipam.Leases(t, network); len(l) != 0 {
					t.Fatalf("leases after failed ADD: %v", l)
				}
				for _, ip := range []string{p.v4Start(), p.v6Start()} {
					if rs := routesTo(t, net.ParseIP(ip)); len(rs) != 0 {
						t.Fatalf("routes left: %v", rs)
					}
				}
				inNS(t, pod, func() error {
					if _, err := netlink.LinkByName("eth0"); err == nil {
						return fmt.Errorf("pod eth0 left behind")
					}
					return nil
				})
			})
		})
	}
	t.Run("fake-ipam", func(t *testing.T) {
		cases := []struct {
			typ     string
			code    uint
			wantLog string
		}{
			{"fail-ipam", 11, "ADD fake\n"},
			{"noip-ipam", types.ErrInternal, "ADD fake\nDEL fake\n"},
		}
		for _, c := range cases {
			t.Run(c.typ, func(t *testing.T) {
				log := filepath.Join(binDir, "fake-ipam.log")
				_ = os.Remove(log)
				network := "iplt-fake"
				cleanupNetwork(t, network)
				pod := netenv.Namespace(t, "iplt-fake").Path
				conf := confBytes(t, "1.1.0", network, map[string]any{"type": c.typ}, nil)
				before := hostLinks(t)
				e := execPlugin(t, "ADD", "fake", pod, "eth0", conf).cniError(t)
				if e.Code != c.code {
					t.Fatalf("error %+v, want code %d", e, c.code)
				}
				if after := hostLinks(t); linksChanged(before, after) {
					t.Fatalf("host links changed:\n%v\n%v", before, after)
				}
				if got := readFile(t, log); got != c.wantLog {
					t.Fatalf("IPAM calls %q, want %q", got, c.wantLog)
				}
			})
		}
	})
}

// TestLibcniAllVersions: ADD, CHECK, DEL through libcni with a conflist in every
// supported cniVersion (GC and STATUS at 1.1.0).
func TestLibcniAllVersions(t *testing.T) {
	for i, k := range ipamKinds {
		t.Run(k.name, func(t *testing.T) {
			for _, v := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
				t.Run(v, func(t *testing.T) {
					ipam := k.new(t)
					network := "iplt-v" + strings.ReplaceAll(v, ".", "")
					cleanupNetwork(t, network)
					pod := netenv.Namespace(t, "iplt-ver").Path
					list := confList(t, v, network, ipam.Section(pool{idx: 6 + i}, true, false))
					cni := newCNI(t)
					ctx := context.Background()
					rt := &libcni.RuntimeConf{ContainerID: "ver-" + v, NetNS: pod, IfName: "net1"}
					res, err := cni.AddNetworkList(ctx, list, rt)
					if err != nil {
						t.Fatalf("ADD: %v", err)
					}
					if res.Version() != v {
						t.Fatalf("result version %s, want %s", res.Version(), v)
					}
					cur, err := current.NewResultFromResult(res)
					if err != nil {
						t.Fatal(err)
					}
					hostName := veth.HostVethName("ipl", network, rt.ContainerID, "net1")
					if len(cur.Interfaces) != 2 || cur.Interfaces[0].Name != hostName || cur.Interfaces[1].Name != "net1" || cur.Interfaces[1].Sandbox != pod {
						t.Fatalf("interfaces %+v", cur.Interfaces)
					}
					if len(cur.IPs) != 2 || len(cur.Routes) != 2 {
						t.Fatalf("result %+v", cur)
					}
					for _, ip := range cur.IPs {
						if ip.Interface == nil || *ip.Interface != 1 {
							t.Fatalf("ip %v not on interface 1", ip)
						}
						if ones, bits := ip.Address.Mask.Size(); ones != bits {
							t.Fatalf("pod address %v not a host address", ip.Address)
						}
					}
					l, err := netlink.LinkByName(hostName)
					if err != nil || l.Attrs().MTU != 1400 || !strings.HasPrefix(l.Attrs().Alias, "ipledger-veth net="+network+" cid="+rt.ContainerID+" if=net1 netns=") {
						t.Fatalf("host veth %v %v", l, err)
					}
					if v != "0.3.1" {
						if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
							t.Fatalf("CHECK: %v", err)
						}
					}
					if v == "1.1.0" {
						if err := cni.GetStatusNetworkList(ctx, list); err != nil {
							t.Fatalf("STATUS: %v", err)
						}
						if err := cni.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: rt.ContainerID, IfName: rt.IfName}}}); err != nil {
							t.Fatalf("GC: %v", err)
						}
						if _, err := netlink.LinkByName(hostName); err != nil {
							t.Fatalf("GC removed a valid attachment: %v", err)
						}
					}
					if err := cni.DelNetworkList(ctx, list, rt); err != nil {
						t.Fatalf("DEL: %v", err)
					}
					if _, err := netlink.LinkByName(hostName); err == nil {
						t.Fatalf("%s still exists after DEL", hostName)
					}
					if l := ipam.Leases(t, network); len(l) != 0 {
						t.Fatalf("leases after DEL: %v", l)
					}
					if err := cni.DelNetworkList(ctx, list, rt); err != nil {
						t.Fatalf("second DEL: %v", err)
					}
				})
			}
		})
	}
}

// TestCheckGuards: CHECK passes on a fresh attachment, refuses a namespace other
// than the one recorded at ADD without entering it, and notices drift.
func TestCheckGuards(t *testing.T) {
	for i, k := range ipamKinds {
		t.Run(k.name, func(t *testing.T) {
			ipam := k.new(t)
			network := "iplt-check"
			cleanupNetwork(t, network)
			pod, other := netenv.Namespace(t, "iplt-chk").Path, netenv.Namespace(t, "iplt-chko").Path
			conf := confBytes(t, "1.0.0", network, ipam.Section(pool{idx: 8 + i}, true, false), nil)
			add := execPlugin(t, "ADD", "chk", pod, "eth0", conf)
			add.ok(t)
			t.Cleanup(func() { execPlugin(t, "DEL", "chk", "", "eth0", conf).ok(t) })
			withPrev := confBytes(t, "1.0.0", network, ipam.Section(pool{idx: 8 + i}, true, false), map[string]any{"prevResult": json.RawMessage(add.stdout)})
			execPlugin(t, "CHECK", "chk", pod, "eth0", withPrev).ok(t)

			e := execPlugin(t, "CHECK", "chk", other, "eth0", withPrev).cniError(t)
			if e.Code != types.ErrInvalidNetNS || !strings.Contains(e.Msg, "recorded") {
				t.Fatalf("CHECK in another namespace: %+v", e)
			}
			e = execPlugin(t, "CHECK", "chk", "/proc/1/ns/net", "eth0", withPrev).cniError(t)
			if e.Code != types.ErrInvalidNetNS {
				t.Fatalf("CHECK in host namespace: %+v", e)
			}
			inNS(t, pod, func() error {
				return netlink.RouteDel(&netlink.Route{Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Gw: veth.GatewayV4})
			})
			e = execPlugin(t, "CHECK", "chk", pod, "eth0", withPrev).cniError(t)
			if !strings.Contains(e.Msg, "route 0.0.0.0/0") {
				t.Fatalf("CHECK after route removal: %+v", e)
			}
		})
	}
}

// TestGCRemovesStaleVeths: GC removes this network's host veths whose attachment is
// not valid, and nothing of other networks.
func TestGCRemovesStaleVeths(t *testing.T) {
	for i, k := range ipamKinds {
		t.Run(k.name, func(t *testing.T) {
			ipam := k.new(t)
			netA, netB := "iplt-gca", "iplt-gcb"
			cleanupNetwork(t, netA)
			cleanupNetwork(t, netB)
			p := pool{idx: 10 + i}
			confA := confBytes(t, "1.1.0", netA, ipam.Section(p, false, false), nil)
			confB := confBytes(t, "1.1.0", netB, ipam.Section(pool{idx: 11 + i}, false, false), nil)
			keep, stale, other := netenv.Namespace(t, "iplt-gck").Path, netenv.Namespace(t, "iplt-gcs").Path, netenv.Namespace(t, "iplt-gco").Path
			execPlugin(t, "ADD", "keep", keep, "eth0", confA).ok(t)
			staleRes := execPlugin(t, "ADD", "stale", stale, "eth0", confA)
			staleRes.ok(t)
			execPlugin(t, "ADD", "stale", other, "eth0", confB).ok(t)
			t.Cleanup(func() {
				execPlugin(t, "DEL", "keep", "", "eth0", confA).ok(t)
				execPlugin(t, "DEL", "stale", "", "eth0", confA).ok(t)
				execPlugin(t, "DEL", "stale", "", "eth0", confB).ok(t)
			})
			// Without a list GC refuses and removes nothing.
			noList := execPlugin(t, "GC", "", "", "", confBytes(t, "1.1.0", netA, ipam.Section(p, false, false), nil))
			if e := noList.cniError(t); e == nil || e.Code != types.ErrInvalidNetworkConfig || !strings.Contains(e.Msg, "cni.dev/valid-attachments") {
				t.Fatalf("GC without cni.dev/valid-attachments: %+v, want code %d naming the field", e, types.ErrInvalidNetworkConfig)
			}
			for _, cid := range []string{"keep", "stale"} {
				if _, err := netlink.LinkByName(veth.HostVethName("ipl", netA, cid, "eth0")); err != nil {
					t.Fatalf("GC without a list removed %s's veth: %v", cid, err)
				}
			}
			// The spec's older key names the valid attachments too.
			gc := confBytes(t, "1.1.0", netA, ipam.Section(p, false, false), map[string]any{
				"cni.dev/attachments": []map[string]string{{"containerID": "keep", "ifname": "eth0"}}})
			execPlugin(t, "GC", "", "", "", gc).ok(t)
			for _, c := range []struct {
				net, cid string
				exists   bool
			}{{netA, "keep", true}, {netA, "stale", false}, {netB, "stale", true}} {
				_, err := netlink.LinkByName(veth.HostVethName("ipl", c.net, c.cid, "eth0"))
				if (err == nil) != c.exists {
					t.Fatalf("%s/%s: exists=%v, want %v", c.net, c.cid, err == nil, c.exists)
				}
			}
			for _, ip := range resultIPs(t, staleRes.stdout) {
				if rs := routesTo(t, ip); len(rs) != 0 {
					t.Fatalf("GC left routes to %s: %v", ip, rs)
				}
			}
		})
	}
}

// TestForeignInterfaceUntouched: an interface that has an attachment's
// deterministic name but is not ours (no alias, or another attachment's alias) is
// neither deleted by DEL nor replaced by ADD.
func TestForeignInterfaceUntouched(t *testing.T) {
	for i, k := range ipamKinds {
		t.Run(k.name, func(t *testing.T) {
			network := "iplt-foreign"
			cid := "foreign"
			hostName := veth.HostVethName("ipl", network, cid, "eth0")
			for _, alias := range []string{"", "ipledger-veth net=" + network + " cid=someone-else if=eth0 netns=1:2"} {
				t.Run(fmt.Sprintf("alias=%q", alias), func(t *testing.T) {
					ipam := k.new(t)
					pod := netenv.Namespace(t, "iplt-for").Path
					podNS, err := os.Open(pod)
					if err != nil {
						t.Fatal(err)
					}
					defer podNS.Close()
					// A foreign veth with our name, its peer in a test namespace.
					if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostName},
						PeerName: "peer0", PeerNamespace: netlink.NsFd(int(podNS.Fd()))}); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() {
						if l, err := netlink.LinkByName(hostName); err == nil {
							_ = netlink.LinkDel(l)
						}
					})
					if alias != "" {
						l, err := netlink.LinkByName(hostName)
						if err != nil {
							t.Fatal(err)
						}
						if err := netlink.LinkSetAlias(l, alias); err != nil {
							t.Fatal(err)
						}
					}
					conf := confBytes(t, "1.0.0", network, ipam.Section(pool{idx: 12 + i}, false, false), nil)
					before := hostLinks(t)
					e := execPlugin(t, "ADD", cid, netenv.Namespace(t, "iplt-for").Path, "eth0", conf).cniError(t)
					if !strings.Contains(e.Msg, "not an ipledger-veth attachment") {
						t.Fatalf("ADD over a foreign interface: %+v", e)
					}
					if l := ipam.Leases(t, network); len(l) != 0 {
						t.Fatalf("leases after refused ADD: %v", l)
					}
					execPlugin(t, "DEL", cid, "", "eth0", conf).ok(t)
					if after := hostLinks(t); linksChanged(before, after) {
						t.Fatalf("host links changed:\n%v\n%v", before, after)
					}
				})
			}
		})
	}
}

// TestDelLenientConfig: DEL succeeds whenever it can name the attachment. Fields DEL
// does not use (an out-of-range or mistyped mtu, routes of the wrong shape) and a
// hostVethPrefix that changed to something invalid since ADD do not stop it: the veth
// goes (found by the attachment in its alias) and the lease is released.
func TestDelLenientConfig(t *testing.T) {
	k := ipamKinds[0]
	cases := []struct {
		name  string
		extra map[string]any
	}{
		{"mtu-out-of-range", map[string]any{"mtu": 5}},
		{"mtu-string", map[string]any{"mtu": "big"}},
		{"bad-prefix", map[string]any{"hostVethPrefix": "this prefix is bad"}},
		{"prefix-number", map[string]any{"hostVethPrefix": 7}},
		{"dns-wrong-type", map[string]any{"dns": "8.8.8.8"}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ipam := k.new(t)
			network := "iplt-ldel"
			cleanupNetwork(t, network)
			pod := netenv.Namespace(t, "iplt-ldel").Path
			section := ipam.Section(pool{idx: 10 + i}, true, false)
			good := confBytes(t, "1.0.0", network, section, nil)
			cid := "ldel-" + c.name
			hostName := veth.HostVethName(veth.DefaultHostVethPrefix, network, cid, "eth0")
			execPlugin(t, "ADD", cid, pod, "eth0", good).ok(t)
			if _, err := netlink.LinkByName(hostName); err != nil {
				t.Fatalf("host veth %s: %v", hostName, err)
			}
			bad := confBytes(t, "1.0.0", network, section, c.extra)
			execPlugin(t, "DEL", cid, pod, "eth0", bad).ok(t)
			if _, err := netlink.LinkByName(hostName); err == nil {
				t.Fatalf("host veth %s left after DEL with %v", hostName, c.extra)
			}
			if l := ipam.Leases(t, network); len(l) != 0 {
				t.Fatalf("leases left after DEL with %v: %v", c.extra, l)
			}
		})
	}
}
