package cniplugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
)

// Result is an IPAM plugin's ADD result: addresses, routes and DNS. (An IPAM plugin
// reports no interfaces.)
type Result struct {
	IPs    []IPConfig
	Routes []*Route
	DNS    DNS
}

// IPConfig is one address of a result.
type IPConfig struct {
	Address   net.IPNet
	Gateway   net.IP // nil: none
	Interface *int   // index into the result's interfaces; nil: none
}

// Route is a route of a configuration or a result.
type Route struct {
	Dst      net.IPNet
	GW       net.IP
	MTU      int
	AdvMSS   int
	Priority int
	Table    *int
	Scope    *int
}

// DNS is the dns section of a configuration or a result.
type DNS struct {
	Nameservers []string `json:"nameservers,omitempty"`
	Domain      string   `json:"domain,omitempty"`
	Search      []string `json:"search,omitempty"`
	Options     []string `json:"options,omitempty"`
}

// IsEmpty reports whether the section says nothing.
func (d *DNS) IsEmpty() bool {
	return len(d.Nameservers) == 0 && d.Domain == "" && len(d.Search) == 0 && len(d.Options) == 0
}

// route is Route's JSON form.
type route struct {
	Dst      *string `json:"dst"`
	GW       net.IP  `json:"gw,omitempty"`
	MTU      int     `json:"mtu,omitempty"`
	AdvMSS   int     `json:"advmss,omitempty"`
	Priority int     `json:"priority,omitempty"`
	Table    *int    `json:"table,omitempty"`
	Scope    *int    `json:"scope,omitempty"`
}

// UnmarshalJSON reads a route; dst keeps the address as written (10.1.2.3/24 stays
// that, as the library keeps it).
func (r *Route) UnmarshalJSON(b []byte) error {
	var raw route
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	*r = Route{GW: raw.GW, MTU: raw.MTU, AdvMSS: raw.AdvMSS, Priority: raw.Priority, Table: raw.Table, Scope: raw.Scope}
	if raw.Dst != nil {
		ip, n, err := net.ParseCIDR(*raw.Dst)
		if err != nil {
			return err
		}
		r.Dst = net.IPNet{IP: ip, Mask: n.Mask}
	}
	return nil
}

// Encode writes r as the result of spec version v, byte for byte as the library
// prints it (Result.GetAsVersion(v), then PrintTo): for 0.3.x and 0.4.0 each address
// carries its IP version and the dns section is always present; from 1.0.0 the keys
// are sorted (the library's Result.MarshalJSON goes through a map) and an empty dns
// section is left out. TestEncodeMatchesLibrary holds it to that.
func (r *Result) Encode(v string) ([]byte, error) {
	var old bool // 0.3.x and 0.4.0
	switch v {
	case "0.3.0", "0.3.1", "0.4.0":
		old = true
	case "1.0.0", "1.1.0":
	default:
		return nil, fmt.Errorf("cniVersion %q: no result format for it (this plugin writes 0.3.0 to 1.1.0)", v)
	}
	sorted := !old
	top := []field{{"cniVersion", quote(v)}}
	if len(r.IPs) > 0 {
		ips := make([]string, len(r.IPs))
		for i, ip := range r.IPs {
			var f []field
			if old {
				version := "6"
				if ip.Address.IP.To4() != nil {
					version = "4"
				}
				f = append(f, field{"version", quote(version)})
			}
			if ip.Interface != nil {
				f = append(f, field{"interface", strconv.Itoa(*ip.Interface)})
			}
			f = append(f, field{"address", quote(ip.Address.String())})
			if len(ip.Gateway) > 0 {
				f = append(f, field{"gateway", quote(ip.Gateway.String())})
			}
			ips[i] = object(f, sorted)
		}
		top = append(top, field{"ips", array(ips)})
	}
	if len(r.Routes) > 0 {
		routes := make([]string, len(r.Routes))
		for i, rt := range r.Routes {
			f := []field{{"dst", quote(rt.Dst.String())}}
			if len(rt.GW) > 0 {
				f = append(f, field{"gw", quote(rt.GW.String())})
			}
			for _, n := range []struct {
				key string
				v   int
			}{{"mtu", rt.MTU}, {"advmss", rt.AdvMSS}, {"priority", rt.Priority}} {
				if n.v != 0 {
					f = append(f, field{n.key, strconv.Itoa(n.v)})
				}
			}
			if rt.Table != nil {
				f = append(f, field{"table", strconv.Itoa(*rt.Table)})
			}
			if rt.Scope != nil {
				f = append(f, field{"scope", strconv.Itoa(*rt.Scope)})
			}
			routes[i] = object(f, sorted)
		}
		top = append(top, field{"routes", array(routes)})
	}
	if old || !r.DNS.IsEmpty() {
		var f []field
		if len(r.DNS.Nameservers) > 0 {
			f = append(f, field{"nameservers", quoteAll(r.DNS.Nameservers)})
		}
		if r.DNS.Domain != "" {
			f = append(f, field{"domain", quote(r.DNS.Domain)})
		}
		if len(r.DNS.Search) > 0 {
			f = append(f, field{"search", quoteAll(r.DNS.Search)})
		}
		if len(r.DNS.Options) > 0 {
			f = append(f, field{"options", quoteAll(r.DNS.Options)})
		}
		top = append(top, field{"dns", object(f, sorted)})
	}
	var out bytes.Buffer
	if err := json.Indent(&out, []byte(object(top, sorted)), "", "    "); err != nil {
		return nil, fmt.Errorf("result JSON: %w", err)
	}
	return out.Bytes(), nil
}

// field is one member of a JSON object, its value already JSON.
type field struct{ key, json string }

// object writes the fields in their order (the library's struct order) or sorted by
// key (the order of a map, as the library's 1.x results are written).
func object(fs []field, sorted bool) string {
	if sorted {
		sort.Slice(fs, func(i, j int) bool { return fs[i].key < fs[j].key })
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range fs {
		if i > 0 {
			b.WriteByte(',')
		}
		writeStr(&b, f.key)
		b.WriteByte(':')
		b.WriteString(f.json)
	}
	b.WriteByte('}')
	return b.String()
}

func array(elems []string) string { return "[" + strings.Join(elems, ",") + "]" }

func quote(s string) string {
	var b bytes.Buffer
	writeStr(&b, s)
	return b.String()
}

func quoteAll(v []string) string {
	q := make([]string, len(v))
	for i, s := range v {
		q[i] = quote(s)
	}
	return array(q)
}
