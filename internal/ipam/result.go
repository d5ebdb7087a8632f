package ipam

import (
	"net"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/ipledger/ipledger/internal/jsonlite"
)

// fastResult writes an ADD result as the CNI library prints it
// (result.GetAsVersion(v) then PrintTo), without its reflection: the library's
// Result.MarshalJSON marshals, unmarshals into a map and marshals again, and PrintTo
// indents, about 0.1 ms of a cold plugin process. It covers the results this plugin
// gives for spec versions 1.0.0 and 1.1.0 without routes or DNS; ok is false for any
// other result, which the caller prints through the library.
// TestFastResultMatchesLibrary compares the bytes with the library's.
func fastResult(r *current.Result, version string) (b []byte, ok bool) {
	if version != "1.0.0" && version != "1.1.0" {
		return nil, false
	}
	if len(r.Interfaces) > 0 || len(r.Routes) > 0 || !r.DNS.IsEmpty() {
		return nil, false
	}
	// Result.MarshalJSON goes through a map: keys sorted, each IP an object with
	// address, gateway (when set) and interface (when set; left to the library)
	e := jsonlite.NewEncoder(make([]byte, 0, 160))
	e.Raw("{\n    \"cniVersion\": ")
	e.Str(version)
	if len(r.IPs) > 0 {
		e.Raw(",\n    \"ips\": [")
		for i, ip := range r.IPs {
			if ip == nil || ip.Interface != nil {
				return nil, false
			}
			if i > 0 {
				e.Raw(",")
			}
			e.Raw("\n        {\n            \"address\": ")
			e.Str((&net.IPNet{IP: ip.Address.IP, Mask: ip.Address.Mask}).String())
			if ip.Gateway != nil {
				e.Raw(",\n            \"gateway\": ")
				e.Str(ip.Gateway.String())
			}
			e.Raw("\n        }")
		}
		e.Raw("\n    ]")
	}
	e.Raw("\n}")
	return e.B, e.OK
}
