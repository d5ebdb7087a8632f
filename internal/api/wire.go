package api

// Hand-written JSON for the hot path of every CNI call: the plugin's ADD/DEL request
// and the agent's answer to it. A plugin is a new process per call, so encoding/json
// builds its reflection caches for Request, Response, LeaseView and time.Time on every
// ADD: measured at about 0.3 ms of a cold plugin process (json.Marshal of a Request
// ~0.1 ms, json.Unmarshal of an ADD answer ~0.2 ms), the largest share of the plugin's
// own work. The agent pays the reflection on every request too.
//
// Why by hand and not a library: the ecosystem's fast JSON libraries either generate
// code (easyjson, ffjson: a build step and large generated files) or use unsafe and
// JIT tricks (sonic) that cost more at process start than they save on one message.
// Both messages are small and fixed, so the encoders and decoders below are short.
//
// Contract, checked by the tests in wire_test.go against encoding/json:
//   - the encoders produce exactly the bytes json.Marshal produces; any value they do
//     not handle (a string needing escapes, an unusual time, a response carrying
//     leases, audit, history or pool) is left to json.Marshal;
//   - the decoders accept a strict subset of JSON (the keys spelled exactly as the
//     struct tags, no duplicates, no escapes, no nulls); anything else is left to
//     json.Unmarshal, so every input decodes exactly as encoding/json decodes it.

import (
	"encoding/json"
	"net/netip"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
)

// MarshalRequest is json.Marshal(req) without reflection for the usual requests.
func MarshalRequest(req Request) ([]byte, error) {
	if b, ok := appendRequest(make([]byte, 0, 256), &req); ok {
		return b, nil
	}
	return json.Marshal(req)
}

// MarshalResponse is json.Marshal(resp) without reflection for the answers to ADD,
// DEL, CHECK, STATUS-less calls and errors.
func MarshalResponse(resp *Response) ([]byte, error) {
	if b, ok := appendResponse(make([]byte, 0, 320), resp); ok {
		return b, nil
	}
	return json.Marshal(resp)
}

// UnmarshalRequest is json.Unmarshal(data, req).
func UnmarshalRequest(data []byte, req *Request) error {
	var r Request
	if d := (decoder{b: data}); d.request(&r) && d.end() {
		*req = r
		return nil
	}
	return json.Unmarshal(data, req)
}

// UnmarshalResponse is json.Unmarshal(data, resp).
func UnmarshalResponse(data []byte, resp *Response) error {
	var r Response
	if d := (decoder{b: data}); d.response(&r) && d.end() {
		*resp = r
		return nil
	}
	return json.Unmarshal(data, resp)
}

// ---- encoding ----

// plain reports whether json.Marshal writes s as its bytes between quotes: printable
// ASCII without the characters it escapes, or valid UTF-8 beyond ASCII other than
// U+2028 and U+2029.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' || c == 0x7f {
			return false
		}
		if c >= 0x80 {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError || r == '\u2028' || r == '\u2029' {
				return false
			}
			i += size - 1
		}
	}
	return true
}

type encoder struct {
	b  []byte
	ok bool
}

func (e *encoder) raw(s string) { e.b = append(e.b, s...) }

func (e *encoder) str(s string) {
	if !plain(s) {
		e.ok = false
		return
	}
	e.b = append(e.b, '"')
	e.b = append(e.b, s...)
	e.b = append(e.b, '"')
}

// field writes ,"name": (the comma unless first in its object).
func (e *encoder) field(first *bool, name string) {
	if !*first {
		e.b = append(e.b, ',')
	}
	*first = false
	e.b = append(e.b, '"')
	e.b = append(e.b, name...)
	e.b = append(e.b, '"', ':')
}

func (e *encoder) strField(first *bool, name, v string, omitEmpty bool) {
	if omitEmpty && v == "" {
		return
	}
	e.field(first, name)
	e.str(v)
}

func (e *encoder) strings(v []string) {
	if v == nil {
		e.raw("null")
		return
	}
	e.b = append(e.b, '[')
	for i, s := range v {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		e.str(s)
	}
	e.b = append(e.b, ']')
}

func (e *encoder) text(v interface{ AppendText([]byte) ([]byte, error) }) {
	e.b = append(e.b, '"')
	var err error
	if e.b, err = v.AppendText(e.b); err != nil {
		e.ok = false
	}
	e.b = append(e.b, '"')
}

func (e *encoder) ranges(sets []pool.RangeSet) {
	e.b = append(e.b, '[')
	for i, set := range sets {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		if set == nil {
			e.raw("null")
			continue
		}
		e.b = append(e.b, '[')
		for j, r := range set {
			if j > 0 {
				e.b = append(e.b, ',')
			}
			first := true
			e.b = append(e.b, '{')
			e.field(&first, "subnet")
			e.text(r.Subnet)
			for _, a := range []struct {
				name string
				v    netip.Addr
			}{{"rangeStart", r.RangeStart}, {"rangeEnd", r.RangeEnd}, {"gateway", r.Gateway}} {
				if a.v != (netip.Addr{}) {
					e.field(&first, a.name)
					e.text(a.v)
				}
			}
			e.b = append(e.b, '}')
		}
		e.b = append(e.b, ']')
	}
	e.b = append(e.b, ']')
}

func appendRequest(b []byte, r *Request) ([]byte, bool) {
	e := encoder{b: b, ok: true}
	e.raw(`{"version":`)
	e.b = strconv.AppendInt(e.b, int64(r.Version), 10)
	first := false
	e.strField(&first, "op", r.Op, false)
	e.strField(&first, "network", r.Network, true)
	e.strField(&first, "containerID", r.ContainerID, true)
	e.strField(&first, "ifname", r.IfName, true)
	if len(r.Ranges) > 0 {
		e.field(&first, "ranges")
		e.ranges(r.Ranges)
	}
	if r.Pod != (ledger.Pod{}) {
		e.field(&first, "pod")
		e.b = append(e.b, '{')
		f := true
		e.strField(&f, "namespace", r.Pod.Namespace, true)
		e.strField(&f, "name", r.Pod.Name, true)
		e.strField(&f, "uid", r.Pod.UID, true)
		e.strField(&f, "infraContainerID", r.Pod.InfraContainerID, true)
		e.b = append(e.b, '}')
	}
	if r.NetNS != (ledger.NetNS{}) {
		e.field(&first, "netns")
		e.b = append(e.b, '{')
		f := true
		e.strField(&f, "path", r.NetNS.Path, true)
		if r.NetNS.Dev != 0 {
			e.field(&f, "dev")
			e.b = strconv.AppendUint(e.b, r.NetNS.Dev, 10)
		}
		if r.NetNS.Ino != 0 {
			e.field(&f, "ino")
			e.b = strconv.AppendUint(e.b, r.NetNS.Ino, 10)
		}
		e.b = append(e.b, '}')
	}
	if len(r.Valid) > 0 {
		e.field(&first, "valid")
		e.b = append(e.b, '[')
		for i, a := range r.Valid {
			if i > 0 {
				e.b = append(e.b, ',')
			}
			f := true
			e.b = append(e.b, '{')
			e.strField(&f, "containerID", a.ContainerID, false)
			e.strField(&f, "ifname", a.IfName, false)
			e.b = append(e.b, '}')
		}
		e.b = append(e.b, ']')
	}
	if len(r.IPs) > 0 {
		e.field(&first, "ips")
		e.strings(r.IPs)
	}
	e.strField(&first, "ip", r.IP, true)
	e.strField(&first, "detail", r.Detail, true)
	e.b = append(e.b, '}')
	return e.b, e.ok
}

func appendResponse(b []byte, r *Response) ([]byte, bool) {
	if r.Leases != nil || r.Audit != nil || r.History != nil || r.Pool != nil {
		return b, false
	}
	e := encoder{b: b, ok: true}
	e.raw(`{"version":`)
	e.b = strconv.AppendInt(e.b, int64(r.Version), 10)
	first := false
	if r.Error != nil {
		e.field(&first, "error")
		f := true
		e.b = append(e.b, '{')
		e.strField(&f, "code", r.Error.Code, false)
		e.strField(&f, "msg", r.Error.Msg, false)
		e.b = append(e.b, '}')
	}
	if v := r.Lease; v != nil {
		e.field(&first, "lease")
		f := true
		e.b = append(e.b, '{')
		e.strField(&f, "network", v.Network, false)
		e.strField(&f, "containerID", v.ContainerID, false)
		e.strField(&f, "ifname", v.IfName, false)
		e.field(&f, "ips")
		e.strings(v.IPs)
		if len(v.Gateways) > 0 {
			e.field(&f, "gateways")
			e.strings(v.Gateways)
		}
		e.strField(&f, "namespace", v.Namespace, true)
		e.strField(&f, "name", v.Name, true)
		e.strField(&f, "uid", v.UID, true)
		e.strField(&f, "infraContainerID", v.Infra, true)
		e.strField(&f, "netns", v.NetNS, true)
		e.strField(&f, "netnsID", v.NetNSID, true)
		e.field(&f, "created")
		// time.Time.MarshalJSON: RFC 3339 with nanoseconds; a year beyond 0-9999 or a zone
		// offset of 24 hours or more is left to json.Marshal, which reports the error
		if y := v.Created.Year(); y < 0 || y > 9999 {
			e.ok = false
		}
		if _, off := v.Created.Zone(); off <= -24*3600 || off >= 24*3600 {
			e.ok = false
		}
		e.b = append(e.b, '"')
		e.b = v.Created.AppendFormat(e.b, time.RFC3339Nano)
		e.b = append(e.b, '"')
		e.strField(&f, "state", v.State, false)
		e.strField(&f, "sandbox", v.Sandbox, true)
		e.strField(&f, "suspect", v.Suspect, true)
		e.b = append(e.b, '}')
	}
	e.field(&first, "released")
	e.b = strconv.AppendInt(e.b, int64(r.Released), 10)
	if r.Existed {
		e.raw(`,"existed":true`)
	}
	e.b = append(e.b, '}')
	return e.b, e.ok
}

// ---- decoding ----

// decoder reads the strict subset described at the top of this file; every method
// returns false on anything outside it, and the caller falls back to encoding/json.
type decoder struct {
	b []byte
	i int
}

func (d *decoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *decoder) peek() byte {
	d.ws()
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

func (d *decoder) eat(c byte) bool {
	if d.peek() == c {
		d.i++
		return true
	}
	return false
}

func (d *decoder) end() bool { d.ws(); return d.i == len(d.b) }

// str reads a string without escapes, of valid UTF-8.
func (d *decoder) str() (string, bool) {
	if !d.eat('"') {
		return "", false
	}
	start := d.i
	ascii := true
	for ; d.i < len(d.b); d.i++ {
		c := d.b[d.i]
		switch {
		case c == '"':
			s := d.b[start:d.i]
			d.i++
			if !ascii && !utf8.Valid(s) {
				return "", false
			}
			return string(s), true
		case c == '\\' || c < 0x20:
			return "", false
		case c >= 0x80:
			ascii = false
		}
	}
	return "", false
}

// uint reads a non-negative integer of at most 19 digits, no leading zeros.
func (d *decoder) uint() (uint64, bool) {
	d.ws()
	start := d.i
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		d.i++
	}
	n := d.i - start
	if n == 0 || n > 19 || (n > 1 && d.b[start] == '0') {
		return 0, false
	}
	if d.i < len(d.b) && (d.b[d.i] == '.' || d.b[d.i] == 'e' || d.b[d.i] == 'E') {
		return 0, false
	}
	v, err := strconv.ParseUint(string(d.b[start:d.i]), 10, 64)
	return v, err == nil
}

func (d *decoder) int() (int, bool) {
	v, ok := d.uint()
	if !ok || v > 1<<31-1 {
		return 0, false
	}
	return int(v), true
}

func (d *decoder) bool() (bool, bool) {
	d.ws()
	for _, w := range []string{"true", "false"} {
		if len(d.b)-d.i >= len(w) && string(d.b[d.i:d.i+len(w)]) == w {
			d.i += len(w)
			return w == "true", true
		}
	}
	return false, false
}

// object reads {"key": value, ...}, calling field for each key; a key seen twice is
// left to encoding/json.
func (d *decoder) object(field func(key string) bool) bool {
	if !d.eat('{') {
		return false
	}
	if d.eat('}') {
		return true
	}
	var seen []string
	for {
		k, ok := d.str()
		if !ok || !d.eat(':') {
			return false
		}
		for _, s := range seen {
			if s == k {
				return false
			}
		}
		seen = append(seen, k)
		if !field(k) {
			return false
		}
		if d.eat('}') {
			return true
		}
		if !d.eat(',') {
			return false
		}
	}
}

// array reads [elem, ...], calling elem for each element.
func (d *decoder) array(elem func() bool) bool {
	if !d.eat('[') {
		return false
	}
	if d.eat(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if d.eat(']') {
			return true
		}
		if !d.eat(',') {
			return false
		}
	}
}

func (d *decoder) strings() ([]string, bool) {
	out := []string{}
	ok := d.array(func() bool {
		s, ok := d.str()
		out = append(out, s)
		return ok
	})
	return out, ok
}

func (d *decoder) setStr(p *string) bool {
	s, ok := d.str()
	*p = s
	return ok
}

func (d *decoder) addr(p *netip.Addr) bool {
	s, ok := d.str()
	return ok && p.UnmarshalText([]byte(s)) == nil
}

func (d *decoder) ranges() ([]pool.RangeSet, bool) {
	sets := []pool.RangeSet{}
	ok := d.array(func() bool {
		set := pool.RangeSet{}
		ok := d.array(func() bool {
			var r pool.Range
			ok := d.object(func(k string) bool {
				switch k {
				case "subnet":
					s, ok := d.str()
					return ok && r.Subnet.UnmarshalText([]byte(s)) == nil
				case "rangeStart":
					return d.addr(&r.RangeStart)
				case "rangeEnd":
					return d.addr(&r.RangeEnd)
				case "gateway":
					return d.addr(&r.Gateway)
				}
				return false
			})
			set = append(set, r)
			return ok
		})
		sets = append(sets, set)
		return ok
	})
	return sets, ok
}

func (d *decoder) request(r *Request) bool {
	return d.object(func(k string) bool {
		var ok bool
		switch k {
		case "version":
			r.Version, ok = d.int()
		case "op":
			ok = d.setStr(&r.Op)
		case "network":
			ok = d.setStr(&r.Network)
		case "containerID":
			ok = d.setStr(&r.ContainerID)
		case "ifname":
			ok = d.setStr(&r.IfName)
		case "ranges":
			r.Ranges, ok = d.ranges()
		case "pod":
			ok = d.object(func(k string) bool {
				switch k {
				case "namespace":
					return d.setStr(&r.Pod.Namespace)
				case "name":
					return d.setStr(&r.Pod.Name)
				case "uid":
					return d.setStr(&r.Pod.UID)
				case "infraContainerID":
					return d.setStr(&r.Pod.InfraContainerID)
				}
				return false
			})
		case "netns":
			ok = d.object(func(k string) bool {
				var ok bool
				switch k {
				case "path":
					ok = d.setStr(&r.NetNS.Path)
				case "dev":
					r.NetNS.Dev, ok = d.uint()
				case "ino":
					r.NetNS.Ino, ok = d.uint()
				}
				return ok
			})
		case "valid":
			r.Valid = []Attachment{}
			ok = d.array(func() bool {
				var a Attachment
				ok := d.object(func(k string) bool {
					switch k {
					case "containerID":
						return d.setStr(&a.ContainerID)
					case "ifname":
						return d.setStr(&a.IfName)
					}
					return false
				})
				r.Valid = append(r.Valid, a)
				return ok
			})
		case "ips":
			r.IPs, ok = d.strings()
		case "ip":
			ok = d.setStr(&r.IP)
		case "detail":
			ok = d.setStr(&r.Detail)
		}
		return ok
	})
}

func (d *decoder) response(r *Response) bool {
	return d.object(func(k string) bool {
		var ok bool
		switch k {
		case "version":
			r.Version, ok = d.int()
		case "error":
			r.Error = &Error{}
			ok = d.object(func(k string) bool {
				switch k {
				case "code":
					return d.setStr(&r.Error.Code)
				case "msg":
					return d.setStr(&r.Error.Msg)
				}
				return false
			})
		case "lease":
			v := &LeaseView{}
			r.Lease = v
			ok = d.object(func(k string) bool {
				var ok bool
				switch k {
				case "network":
					ok = d.setStr(&v.Network)
				case "containerID":
					ok = d.setStr(&v.ContainerID)
				case "ifname":
					ok = d.setStr(&v.IfName)
				case "ips":
					v.IPs, ok = d.strings()
				case "gateways":
					v.Gateways, ok = d.strings()
				case "namespace":
					ok = d.setStr(&v.Namespace)
				case "name":
					ok = d.setStr(&v.Name)
				case "uid":
					ok = d.setStr(&v.UID)
				case "infraContainerID":
					ok = d.setStr(&v.Infra)
				case "netns":
					ok = d.setStr(&v.NetNS)
				case "netnsID":
					ok = d.setStr(&v.NetNSID)
				case "created":
					var s string
					s, ok = d.str()
					ok = ok && v.Created.UnmarshalText([]byte(s)) == nil
				case "state":
					ok = d.setStr(&v.State)
				case "sandbox":
					ok = d.setStr(&v.Sandbox)
				case "suspect":
					ok = d.setStr(&v.Suspect)
				}
				return ok
			})
		case "released":
			r.Released, ok = d.int()
		case "existed":
			r.Existed, ok = d.bool()
		}
		return ok
	})
}
