package ipam

import (
	"bytes"
	"net"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// TestFastResultMatchesLibrary: the hand-written ADD result is byte for byte what the
// CNI library prints for the same result and version, and every other result is left
// to the library.
func TestFastResultMatchesLibrary(t *testing.T) {
	ipc := func(cidr, gw string) *current.IPConfig {
		ip, n, err := net.ParseCIDR(cidr)
		if err != nil {
			t.Fatal(err)
		}
		c := &current.IPConfig{Address: net.IPNet{IP: ip, Mask: n.Mask}}
		if gw != "" {
			c.Gateway = net.ParseIP(gw)
		}
		return c
	}
	one := 1
	withIf := ipc("10.1.0.3/24", "")
	withIf.Interface = &one
	tests := []struct {
		name    string
		r       current.Result
		version string
		fast    bool
	}{
		{"v4 with gateway", current.Result{IPs: []*current.IPConfig{ipc("10.247.0.2/22", "10.247.0.1")}}, "1.0.0", true},
		{"v4 without gateway", current.Result{IPs: []*current.IPConfig{ipc("10.247.0.2/22", "")}}, "1.1.0", true},
		{"dual stack", current.Result{IPs: []*current.IPConfig{ipc("10.247.0.2/22", "10.247.0.1"), ipc("fd00::2/64", "fd00::1")}}, "1.0.0", true},
		{"v4-mapped", current.Result{IPs: []*current.IPConfig{{Address: net.IPNet{IP: net.ParseIP("10.0.0.2"), Mask: net.CIDRMask(8, 32)}}}}, "1.0.0", true},
		{"no address", current.Result{}, "1.1.0", true},
		{"old version", current.Result{IPs: []*current.IPConfig{ipc("10.247.0.2/22", "10.247.0.1")}}, "0.4.0", false},
		{"0.3.1", current.Result{IPs: []*current.IPConfig{ipc("10.247.0.2/22", "10.247.0.1")}}, "0.3.1", false},
		{"routes", current.Result{IPs: []*current.IPConfig{ipc("10.247.0.2/22", "")}, Routes: []*types.Route{{Dst: net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}}}, "1.0.0", false},
		{"dns", current.Result{DNS: types.DNS{Nameservers: []string{"10.0.0.10"}}}, "1.0.0", false},
		{"interface index", current.Result{IPs: []*current.IPConfig{withIf}}, "1.0.0", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.r
			r.CNIVersion = current.ImplementedSpecVersion
			out, err := r.GetAsVersion(tt.version)
			if err != nil {
				t.Fatal(err)
			}
			var want bytes.Buffer
			if err := out.PrintTo(&want); err != nil {
				t.Fatal(err)
			}
			got, ok := fastResult(&r, tt.version)
			if ok != tt.fast {
				t.Fatalf("hand-written path taken: %v, want %v", ok, tt.fast)
			}
			if ok && !bytes.Equal(got, want.Bytes()) {
				t.Fatalf("got\n%s\nwant\n%s", got, want.Bytes())
			}
		})
	}
}
