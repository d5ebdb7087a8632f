package cniplugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"strconv"
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
	var c bytes.Buffer
	switch v {
	case "0.3.0", "0.3.1", "0.4.0":
		r.encode04(&c, v)
	case "1.0.0", "1.1.0":
		r.encode1(&c, v)
	default:
		return nil, fmt.Errorf("cniVersion %q: no result format for it (this plugin writes 0.3.0 to 1.1.0)", v)
	}
	var out bytes.Buffer
	if err := json.Indent(&out, c.Bytes(), "", "    "); err != nil {
		return nil, fmt.Errorf("result JSON: %w", err)
	}
	return out.Bytes(), nil
}

// member writes "name": after a comma unless it is the object's first.
func member(b *bytes.Buffer, first *bool, name string) {
	if !*first {
		b.WriteByte(',')
	}
	*first = false
	writeStr(b, name)
	b.WriteByte(':')
}

func writeInt(b *bytes.Buffer, first *bool, name string, v int, omitZero bool) {
	if omitZero && v == 0 {
		return
	}
	member(b, first, name)
	b.WriteString(strconv.Itoa(v))
}

func writeStrings(b *bytes.Buffer, first *bool, name string, v []string) {
	if len(v) == 0 {
		return
	}
	member(b, first, name)
	strsVal(v)(b)
}

func (r *Result) encode04(b *bytes.Buffer, v string) {
	first := true
	b.WriteByte('{')
	member(b, &first, "cniVersion")
	writeStr(b, v)
	if len(r.IPs) > 0 {
		member(b, &first, "ips")
		b.WriteByte('[')
		for i, ip := range r.IPs {
			if i > 0 {
				b.WriteByte(',')
			}
			f := true
			b.WriteByte('{')
			member(b, &f, "version")
			if ip.Address.IP.To4() != nil {
				writeStr(b, "4")
			} else {
				writeStr(b, "6")
			}
			if ip.Interface != nil {
				writeInt(b, &f, "interface", *ip.Interface, false)
			}
			member(b, &f, "address")
			writeStr(b, ip.Address.String())
			if len(ip.Gateway) > 0 {
				member(b, &f, "gateway")
				writeStr(b, ip.Gateway.String())
			}
			b.WriteByte('}')
		}
		b.WriteByte(']')
	}
	if len(r.Routes) > 0 {
		member(b, &first, "routes")
		b.WriteByte('[')
		for i, rt := range r.Routes {
			if i > 0 {
				b.WriteByte(',')
			}
			f := true
			b.WriteByte('{')
			member(b, &f, "dst")
			writeStr(b, rt.Dst.String())
			if len(rt.GW) > 0 {
				member(b, &f, "gw")
				writeStr(b, rt.GW.String())
			}
			writeInt(b, &f, "mtu", rt.MTU, true)
			writeInt(b, &f, "advmss", rt.AdvMSS, true)
			writeInt(b, &f, "priority", rt.Priority, true)
			if rt.Table != nil {
				writeInt(b, &f, "table", *rt.Table, false)
			}
			if rt.Scope != nil {
				writeInt(b, &f, "scope", *rt.Scope, false)
			}
			b.WriteByte('}')
		}
		b.WriteByte(']')
	}
	member(b, &first, "dns")
	f := true
	b.WriteByte('{')
	writeStrings(b, &f, "nameservers", r.DNS.Nameservers)
	if r.DNS.Domain != "" {
		member(b, &f, "domain")
		writeStr(b, r.DNS.Domain)
	}
	writeStrings(b, &f, "search", r.DNS.Search)
	writeStrings(b, &f, "options", r.DNS.Options)
	b.WriteByte('}')
	b.WriteByte('}')
}

// kv is one member of an object written with sorted keys.
type kv struct {
	key   string
	write func(*bytes.Buffer)
}

func writeSorted(b *bytes.Buffer, members []kv) {
	sort.Slice(members, func(i, j int) bool { return members[i].key < members[j].key })
	first := true
	b.WriteByte('{')
	for _, m := range members {
		member(b, &first, m.key)
		m.write(b)
	}
	b.WriteByte('}')
}

func strVal(s string) func(*bytes.Buffer) { return func(b *bytes.Buffer) { writeStr(b, s) } }
func intVal(v int) func(*bytes.Buffer) {
	return func(b *bytes.Buffer) { b.WriteString(strconv.Itoa(v)) }
}
func strsVal(v []string) func(*bytes.Buffer) {
	return func(b *bytes.Buffer) {
		b.WriteByte('[')
		for i, s := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			writeStr(b, s)
		}
		b.WriteByte(']')
	}
}

func (r *Result) encode1(b *bytes.Buffer, v string) {
	var top []kv
	top = append(top, kv{"cniVersion", strVal(v)})
	if !r.DNS.IsEmpty() {
		d := r.DNS
		top = append(top, kv{"dns", func(b *bytes.Buffer) {
			var m []kv
			if len(d.Nameservers) > 0 {
				m = append(m, kv{"nameservers", strsVal(d.Nameservers)})
			}
			if d.Domain != "" {
				m = append(m, kv{"domain", strVal(d.Domain)})
			}
			if len(d.Search) > 0 {
				m = append(m, kv{"search", strsVal(d.Search)})
			}
			if len(d.Options) > 0 {
				m = append(m, kv{"options", strsVal(d.Options)})
			}
			writeSorted(b, m)
		}})
	}
	if len(r.IPs) > 0 {
		top = append(top, kv{"ips", func(b *bytes.Buffer) {
			b.WriteByte('[')
			for i, ip := range r.IPs {
				if i > 0 {
					b.WriteByte(',')
				}
				m := []kv{{"address", strVal(ip.Address.String())}}
				if len(ip.Gateway) > 0 {
					m = append(m, kv{"gateway", strVal(ip.Gateway.String())})
				}
				if ip.Interface != nil {
					m = append(m, kv{"interface", intVal(*ip.Interface)})
				}
				writeSorted(b, m)
			}
			b.WriteByte(']')
		}})
	}
	if len(r.Routes) > 0 {
		top = append(top, kv{"routes", func(b *bytes.Buffer) {
			b.WriteByte('[')
			for i, rt := range r.Routes {
				if i > 0 {
					b.WriteByte(',')
				}
				m := []kv{{"dst", strVal(rt.Dst.String())}}
				if len(rt.GW) > 0 {
					m = append(m, kv{"gw", strVal(rt.GW.String())})
				}
				for _, f := range []struct {
					k string
					v int
				}{{"mtu", rt.MTU}, {"advmss", rt.AdvMSS}, {"priority", rt.Priority}} {
					if f.v != 0 {
						m = append(m, kv{f.k, intVal(f.v)})
					}
				}
				if rt.Table != nil {
					m = append(m, kv{"table", intVal(*rt.Table)})
				}
				if rt.Scope != nil {
					m = append(m, kv{"scope", intVal(*rt.Scope)})
				}
				writeSorted(b, m)
			}
			b.WriteByte(']')
		}})
	}
	writeSorted(b, top)
}
