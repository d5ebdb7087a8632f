package ipam_test

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

const dualRanges = `[[{"subnet":"10.77.0.0/24","rangeStart":"10.77.0.10","rangeEnd":"10.77.0.200","gateway":"10.77.0.1"}],[{"subnet":"fd77::/64"}]]`

func resultIPs(t *testing.T, r types.Result) []string {
	t.Helper()
	res, err := current.NewResultFromResult(r)
	if err != nil {
		t.Fatalf("result %v: %v", r, err)
	}
	var out []string
	for _, ip := range res.IPs {
		out = append(out, ip.Address.String())
	}
	return out
}

// TestVerbsEveryVersion drives every verb through libcni in every version the plugin
// claims: ADD (dual stack, gateway), CHECK from 0.4.0, DEL, VERSION, and GC and
// STATUS in 1.1.0 (libcni calls neither for older versions, so they must be no-ops).
func TestVerbsEveryVersion(t *testing.T) {
	e := newEnv(t, agentenv.Options{})
	nsPath := netenv.Namespace(t, "ipl").Path
	for _, v := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			// one network for every version: two network names may not share
			// addresses (the agent refuses the second pool)
			name := "net-dual"
			l := e.list(v, name, dualRanges)
			id := "ctr" + strings.ReplaceAll(v, ".", "")
			c := ctx(t)

			res, err := e.cni.AddNetworkList(c, l, rt(id, nsPath))
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if res.Version() != v {
				t.Fatalf("ADD answered version %s, want %s", res.Version(), v)
			}
			ips := resultIPs(t, res)
			if len(ips) != 2 || !strings.HasPrefix(ips[0], "10.77.0.") || !strings.HasSuffix(ips[0], "/24") || !strings.HasPrefix(ips[1], "fd77::") {
				t.Fatalf("ADD gave %v, want one 10.77.0.x/24 and one fd77::/64 address", ips)
			}
			cur, _ := current.NewResultFromResult(res)
			if !cur.IPs[0].Gateway.Equal(net.ParseIP("10.77.0.1")) {
				t.Fatalf("gateway %v, want 10.77.0.1", cur.IPs[0].Gateway)
			}
			if got := ipsOf(e.a.Leases(t), name, id); !slices.Equal(got, ips) {
				t.Fatalf("ledger holds %v for %s, ADD answered %v", got, id, ips)
			}

			if ok, _ := version.GreaterThanOrEqualTo(v, "0.4.0"); ok {
				if err := e.cni.CheckNetworkList(c, l, rt(id, nsPath)); err != nil {
					t.Fatalf("CHECK: %v", err)
				}
			}
			// STATUS and GC: only 1.1.0 reaches the plugin; an empty GC list keeps
			// the live attachment (libcni passes it as valid).
			if err := e.cni.GetStatusNetworkList(c, l); err != nil {
				t.Fatalf("STATUS: %v", err)
			}
			if err := e.cni.GCNetworkList(c, l, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: id, IfName: "eth0"}}}); err != nil {
				t.Fatalf("GC: %v", err)
			}
			if got := ipsOf(e.a.Leases(t), name, id); !slices.Equal(got, ips) {
				t.Fatalf("after GC listing it as valid the attachment holds %v, want %v", got, ips)
			}

			if err := e.cni.DelNetworkList(c, l, rt(id, nsPath)); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if got := ipsOf(e.a.Leases(t), name, id); got != nil {
				t.Fatalf("after DEL the attachment still holds %v", got)
			}
			// DEL again (unknown attachment) succeeds
			if err := e.cni.DelNetworkList(c, l, rt(id, "")); err != nil {
				t.Fatalf("second DEL: %v", err)
			}
			if ok, _ := version.GreaterThanOrEqualTo(v, "0.4.0"); ok {
				// CHECK of an attachment without a lease fails
				if err := e.cni.CheckNetworkList(c, l, rt(id, nsPath)); err == nil {
					t.Fatal("CHECK after DEL succeeded")
				}
			}

			vi, err := e.cni.GetVersionInfo(c, "ipledger")
			if err != nil {
				t.Fatalf("VERSION: %v", err)
			}
			if !slices.Contains(vi.SupportedVersions(), v) {
				t.Fatalf("VERSION lists %v, lacks %s", vi.SupportedVersions(), v)
			}
			out, cerr := execPlugin(t, call{Cmd: "VERSION", Stdin: fmt.Sprintf(`{"cniVersion":%q}`, v)})
			// VERSION answers in its own format whatever the request's version (as skel does)
			if cerr != nil || !strings.Contains(string(out), `"`+v+`"`) {
				t.Fatalf("VERSION with cniVersion %s: %s %v", v, out, cerr)
			}
		})
	}
}

// TestBridgeDelegatesIPAM chains Debian's standard bridge plugin with ipledger as its
// IPAM in a real namespace: the address ipledger leases is the one on the pod's
// interface, CHECK passes, DEL releases it and removes the interface.
func TestBridgeDelegatesIPAM(t *testing.T) {
	e := newEnv(t, agentenv.Options{})
	netNS := netenv.Namespace(t, "ipl")
	ns, nsPath := netNS.Name, netNS.Path
	br := uniq("iplbr")
	t.Cleanup(func() {
		// the bridge plugin creates the bridge; remove it whatever happened
		if err := runQuiet("ip", "link", "show", br); err == nil {
			if out, err := runOut("ip", "link", "del", br); err != nil {
				t.Errorf("ip link del %s: %v %s", br, err, out)
			}
		}
	})
	l := confList(t, fmt.Sprintf(`{"cniVersion":"1.0.0","name":"brnet","plugins":[{"type":"bridge","bridge":%q,"isGateway":false,"ipMasq":false,"ipam":%s}]}`,
		br, e.a.IPAM(`[[{"subnet":"10.78.0.0/24"}]]`)))
	c := ctx(t)
	res, err := e.cni.AddNetworkList(c, l, rt("bridged1", nsPath))
	if err != nil {
		t.Fatalf("ADD through bridge: %v", err)
	}
	ips := resultIPs(t, res)
	if len(ips) != 1 {
		t.Fatalf("ADD gave %v", ips)
	}
	if got := ipsOf(e.a.Leases(t), "brnet", "bridged1"); !slices.Equal(got, ips) {
		t.Fatalf("ledger holds %v, bridge answered %v", got, ips)
	}
	addr := run(t, "ip", "-n", ns, "-o", "addr", "show", "dev", "eth0")
	if !strings.Contains(addr, "inet "+ips[0]+" ") {
		t.Fatalf("eth0 in %s does not carry %s:\n%s", ns, ips[0], addr)
	}
	if err := e.cni.CheckNetworkList(c, l, rt("bridged1", nsPath)); err != nil {
		t.Fatalf("CHECK through bridge: %v", err)
	}
	if err := e.cni.DelNetworkList(c, l, rt("bridged1", nsPath)); err != nil {
		t.Fatalf("DEL through bridge: %v", err)
	}
	if got := ipsOf(e.a.Leases(t), "brnet", "bridged1"); got != nil {
		t.Fatalf("after DEL the ledger still holds %v", got)
	}
	if err := runQuiet("ip", "-n", ns, "link", "show", "eth0"); err == nil {
		t.Fatalf("eth0 still exists in %s after DEL", ns)
	}
}
