package cniplugin

import (
	"bytes"
	"encoding/json"
	"net"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// library converts r to the CNI library's current result.
func library(r *Result) *current.Result {
	lr := &current.Result{CNIVersion: current.ImplementedSpecVersion, DNS: types.DNS(r.DNS)}
	for _, ip := range r.IPs {
		lr.IPs = append(lr.IPs, &current.IPConfig{Address: ip.Address, Gateway: ip.Gateway, Interface: ip.Interface})
	}
	for _, rt := range r.Routes {
		lr.Routes = append(lr.Routes, &types.Route{Dst: rt.Dst, GW: rt.GW, MTU: rt.MTU, AdvMSS: rt.AdvMSS, Priority: rt.Priority, Table: rt.Table, Scope: rt.Scope})
	}
	return lr
}

func cidr(t testing.TB, s string) net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	return net.IPNet{IP: ip, Mask: n.Mask}
}

// TestEncodeMatchesLibrary: every result this plugin can give is, in every spec
// version, byte for byte what the CNI library prints for it (GetAsVersion, PrintTo).
func TestEncodeMatchesLibrary(t *testing.T) {
	zero, one, main, link := 0, 1, 254, 253
	results := map[string]Result{
		"no address":          {},
		"v4 with gateway":     {IPs: []IPConfig{{Address: cidr(t, "10.247.0.2/22"), Gateway: net.ParseIP("10.247.0.1")}}},
		"v4 without gateway":  {IPs: []IPConfig{{Address: cidr(t, "10.247.0.2/22")}}},
		"v4 as 4 bytes":       {IPs: []IPConfig{{Address: net.IPNet{IP: net.IPv4(10, 0, 0, 2).To4(), Mask: net.CIDRMask(8, 32)}, Gateway: net.IPv4(10, 0, 0, 1).To4()}}},
		"v4 as 16 bytes":      {IPs: []IPConfig{{Address: net.IPNet{IP: net.ParseIP("10.0.0.2"), Mask: net.CIDRMask(8, 32)}}}},
		"v6":                  {IPs: []IPConfig{{Address: cidr(t, "fd00:10::2/64"), Gateway: net.ParseIP("fd00:10::1")}}},
		"dual stack":          {IPs: []IPConfig{{Address: cidr(t, "10.247.0.2/22"), Gateway: net.ParseIP("10.247.0.1")}, {Address: cidr(t, "fd00::2/64"), Gateway: net.ParseIP("fd00::1")}}},
		"interface index":     {IPs: []IPConfig{{Address: cidr(t, "10.1.0.3/24"), Interface: &one}, {Address: cidr(t, "10.1.0.4/24"), Interface: &zero}}},
		"default route":       {IPs: []IPConfig{{Address: cidr(t, "10.247.0.2/22")}}, Routes: []*Route{{Dst: cidr(t, "0.0.0.0/0")}}},
		"routes with options": {Routes: []*Route{{Dst: cidr(t, "10.9.0.5/16"), GW: net.ParseIP("10.0.0.1"), MTU: 1400, AdvMSS: 1360, Priority: 5, Table: &main, Scope: &link}, {Dst: cidr(t, "::/0"), GW: net.ParseIP("fd00::1"), Table: &zero}}},
		"dns":                 {DNS: DNS{Nameservers: []string{"10.0.0.10", "fd00::10"}, Domain: "cluster.local", Search: []string{"default.svc.cluster.local", "svc.cluster.local"}, Options: []string{"ndots:5"}}},
		"dns domain only":     {DNS: DNS{Domain: "example.com"}},
		"dns needing escapes": {DNS: DNS{Domain: "a<b>&\"c\\", Search: []string{"é\u2028x", "tab\there"}}},
		"everything":          {IPs: []IPConfig{{Address: cidr(t, "10.247.0.2/22"), Gateway: net.ParseIP("10.247.0.1")}, {Address: cidr(t, "fd00::2/64")}}, Routes: []*Route{{Dst: cidr(t, "0.0.0.0/0"), GW: net.ParseIP("10.247.0.1")}}, DNS: DNS{Nameservers: []string{"10.0.0.10"}}},
	}
	for name, r := range results {
		for _, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
			t.Run(name+"/"+v, func(t *testing.T) {
				out, err := library(&r).GetAsVersion(v)
				if err != nil {
					t.Fatal(err)
				}
				var want bytes.Buffer
				if err := out.PrintTo(&want); err != nil {
					t.Fatal(err)
				}
				got, err := r.Encode(v)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want.Bytes()) {
					t.Fatalf("got\n%s\nlibrary\n%s", got, want.Bytes())
				}
			})
		}
	}
	if _, err := (&Result{}).Encode("0.2.0"); err == nil {
		t.Error("Encode(0.2.0) answered a result; this package has no 0.2.0 format")
	}
}

// TestRouteDecodeMatchesLibrary: a configuration's routes decode as the library's
// types.Route decodes them, and bad ones fail in both.
func TestRouteDecodeMatchesLibrary(t *testing.T) {
	for _, in := range []string{
		`{"dst":"0.0.0.0/0"}`, `{"dst":"10.1.2.3/16","gw":"10.0.0.1"}`, `{"dst":"::/0","gw":"fd00::1","mtu":1400,"advmss":1360,"priority":3,"table":100,"scope":253}`,
		`{"dst":"10.0.0.0/8","table":0,"scope":0}`, `{"gw":"10.0.0.1"}`, `{"dst":"10.0.0.0"}`, `{"dst":"bogus"}`, `{"dst":"10.0.0.0/8","gw":"nope"}`,
		`{"dst":7}`, `[]`, `{"dst":"10.0.0.0/8","mtu":"big"}`, `{"dst":"1.2.3.4/33"}`, `{"dst":"::ffff:10.0.0.1/120"}`,
	} {
		var lib types.Route
		lerr := json.Unmarshal([]byte(in), &lib)
		var ours Route
		oerr := json.Unmarshal([]byte(in), &ours)
		if (lerr == nil) != (oerr == nil) {
			t.Errorf("%s: library error %v, ours %v", in, lerr, oerr)
			continue
		}
		if lerr != nil {
			continue
		}
		if lib.Dst.String() != ours.Dst.String() || !lib.GW.Equal(ours.GW) || lib.MTU != ours.MTU || lib.AdvMSS != ours.AdvMSS || lib.Priority != ours.Priority ||
			!sameInt(lib.Table, ours.Table) || !sameInt(lib.Scope, ours.Scope) {
			t.Errorf("%s: library %+v, ours %+v", in, lib, ours)
		}
	}
}

func sameInt(a, b *int) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }
