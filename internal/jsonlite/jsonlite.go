// Package jsonlite reads and writes the small, fixed JSON messages of ipledger's hot
// paths (the plugin-agent messages, the ledger's records) without reflection.
//
// encoding/json builds a reflection cache per type on first use: a cold plugin process
// pays it on every CNI call, and decoding 64k lease records at agent start spends most
// of its time in reflection. The callers of this package keep encoding/json as the
// reference: a Decoder accepts only a strict subset of JSON (keys spelled exactly as
// the struct tags, each once, strings without escapes, no nulls but a nil []byte's,
// integers only) and reports false on anything else, so that the caller falls back to
// json.Unmarshal; an Encoder writes what json.Marshal writes and reports false for any
// value it does not write the same way (a string json.Marshal would escape), so that
// the caller falls back to json.Marshal. Each caller tests its messages against encoding/json.
//
// Why by hand and not a library: the ecosystem's fast JSON libraries either generate
// code (easyjson, ffjson: a build step and large generated files) or use unsafe and
// JIT tricks (sonic) that cost more at process start than they save on one message.
package jsonlite

import (
	"encoding/base64"
	"net/netip"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Plain reports whether json.Marshal writes s as its bytes between quotes: printable
// ASCII other than the characters it escapes, or valid UTF-8 beyond ASCII other than
// U+2028, U+2029 and U+FFFD (which may stand for invalid bytes).
func Plain(s string) bool {
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

// Encoder appends JSON to B. OK turns false when a value was not written as
// json.Marshal writes it; the caller then discards B.
type Encoder struct {
	B  []byte
	OK bool
}

// NewEncoder starts an encoder appending to b.
func NewEncoder(b []byte) Encoder { return Encoder{B: b, OK: true} }

// Raw appends s as it is.
func (e *Encoder) Raw(s string) { e.B = append(e.B, s...) }

// Str appends s as a JSON string.
func (e *Encoder) Str(s string) {
	if !Plain(s) {
		e.OK = false
		return
	}
	e.B = append(e.B, '"')
	e.B = append(e.B, s...)
	e.B = append(e.B, '"')
}

// Field appends "name": preceded by a comma unless *first, and clears *first.
func (e *Encoder) Field(first *bool, name string) {
	if !*first {
		e.B = append(e.B, ',')
	}
	*first = false
	e.B = append(e.B, '"')
	e.B = append(e.B, name...)
	e.B = append(e.B, '"', ':')
}

// StrField appends "name":"v", or nothing when omitEmpty and v is empty.
func (e *Encoder) StrField(first *bool, name, v string, omitEmpty bool) {
	if omitEmpty && v == "" {
		return
	}
	e.Field(first, name)
	e.Str(v)
}

// UintField appends "name":v, or nothing when omitEmpty and v is zero.
func (e *Encoder) UintField(first *bool, name string, v uint64, omitEmpty bool) {
	if omitEmpty && v == 0 {
		return
	}
	e.Field(first, name)
	e.B = strconv.AppendUint(e.B, v, 10)
}

// Bytes appends b as json.Marshal writes a []byte: standard padded base64 between
// quotes, nil as null.
func (e *Encoder) Bytes(b []byte) {
	if b == nil {
		e.Raw("null")
		return
	}
	e.B = append(e.B, '"')
	e.B = base64.StdEncoding.AppendEncode(e.B, b)
	e.B = append(e.B, '"')
}

// Int appends v.
func (e *Encoder) Int(v int64) { e.B = strconv.AppendInt(e.B, v, 10) }

// Strings appends a []string (nil as null).
func (e *Encoder) Strings(v []string) {
	if v == nil {
		e.Raw("null")
		return
	}
	e.B = append(e.B, '[')
	for i, s := range v {
		if i > 0 {
			e.B = append(e.B, ',')
		}
		e.Str(s)
	}
	e.B = append(e.B, ']')
}

// Text appends v's text form as a JSON string, as json.Marshal does for an
// encoding.TextAppender whose text needs no escaping (addresses, prefixes).
func (e *Encoder) Text(v interface{ AppendText([]byte) ([]byte, error) }) {
	e.B = append(e.B, '"')
	start := len(e.B)
	var err error
	if e.B, err = v.AppendText(e.B); err != nil || !Plain(string(e.B[start:])) {
		e.OK = false
	}
	e.B = append(e.B, '"')
}

// Time appends t as json.Marshal does (time.Time.MarshalJSON: RFC 3339 with
// nanoseconds); a year beyond 0-9999 or a zone offset of 24 hours or more, which
// json.Marshal refuses, clears OK.
func (e *Encoder) Time(t time.Time) {
	if y := t.Year(); y < 0 || y > 9999 {
		e.OK = false
	}
	if _, off := t.Zone(); off <= -24*3600 || off >= 24*3600 {
		e.OK = false
	}
	e.B = append(e.B, '"')
	e.B = t.AppendFormat(e.B, time.RFC3339Nano)
	e.B = append(e.B, '"')
}

// Decoder reads the strict subset of JSON described in the package comment; every
// method returns false on anything outside it.
type Decoder struct {
	b []byte
	i int
}

// NewDecoder reads b.
func NewDecoder(b []byte) *Decoder { return &Decoder{b: b} }

func (d *Decoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *Decoder) eat(c byte) bool {
	d.ws()
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

// End reports whether only white space is left.
func (d *Decoder) End() bool { d.ws(); return d.i == len(d.b) }

// Str reads a string without escapes, of valid UTF-8.
func (d *Decoder) Str() (string, bool) {
	b, ok := d.strBytes()
	return string(b), ok
}

// StrBytes is Str without the copy: the bytes alias the input (valid as long as it
// is), for a caller that compares or interns them.
func (d *Decoder) StrBytes() ([]byte, bool) { return d.strBytes() }

// strBytes is Str without the copy: the bytes alias the input.
func (d *Decoder) strBytes() ([]byte, bool) {
	if !d.eat('"') {
		return nil, false
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
				return nil, false
			}
			return s, true
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= 0x80:
			ascii = false
		}
	}
	return nil, false
}

// Bytes reads a []byte as json.Unmarshal does: standard padded base64 in a string,
// or null for nil (the one null of the subset: json.Marshal writes a nil []byte so).
func (d *Decoder) Bytes() ([]byte, bool) {
	d.ws()
	if len(d.b)-d.i >= 4 && string(d.b[d.i:d.i+4]) == "null" {
		d.i += 4
		return nil, true
	}
	s, ok := d.strBytes()
	if !ok {
		return nil, false
	}
	b := make([]byte, base64.StdEncoding.DecodedLen(len(s)))
	n, err := base64.StdEncoding.Decode(b, s)
	return b[:n], err == nil
}

// SetStr reads a string into *p.
func (d *Decoder) SetStr(p *string) bool {
	s, ok := d.Str()
	*p = s
	return ok
}

// Uint reads a non-negative integer of at most 19 digits without leading zeros.
func (d *Decoder) Uint() (uint64, bool) {
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

// Int reads a non-negative integer below 2^31.
func (d *Decoder) Int() (int, bool) {
	v, ok := d.Uint()
	if !ok || v > 1<<31-1 {
		return 0, false
	}
	return int(v), true
}

// Bool reads true or false.
func (d *Decoder) Bool() (bool, bool) {
	d.ws()
	for _, w := range []string{"true", "false"} {
		if len(d.b)-d.i >= len(w) && string(d.b[d.i:d.i+len(w)]) == w {
			d.i += len(w)
			return w == "true", true
		}
	}
	return false, false
}

// Object reads {"key": value, ...}, calling field for each key to read its value; a
// key seen twice is refused.
func (d *Decoder) Object(field func(key string) bool) bool {
	return d.Fields(func(k []byte) bool { return field(string(k)) })
}

// Fields is Object with each key as bytes that alias the input, valid only during the
// call: it allocates nothing per key (compare with switch string(key), which does not
// copy). Decoding 64k lease records at agent start, Object's key strings were a third
// of all allocations.
func (d *Decoder) Fields(field func(key []byte) bool) bool {
	if !d.eat('{') {
		return false
	}
	if d.eat('}') {
		return true
	}
	var seen [32][]byte
	n := 0
	for {
		k, ok := d.strBytes()
		if !ok || !d.eat(':') {
			return false
		}
		for _, s := range seen[:n] {
			if string(s) == string(k) {
				return false
			}
		}
		if n == len(seen) {
			return false
		}
		seen[n] = k
		n++
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

// Array reads [elem, ...], calling elem to read each element.
func (d *Decoder) Array(elem func() bool) bool {
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

// Strings reads an array of strings (empty: a non-nil empty slice, as encoding/json).
func (d *Decoder) Strings() ([]string, bool) {
	out := []string{}
	ok := d.Array(func() bool {
		s, ok := d.Str()
		out = append(out, s)
		return ok
	})
	return out, ok
}

// Text reads a string into v through its UnmarshalText.
func (d *Decoder) Text(v interface{ UnmarshalText([]byte) error }) bool {
	s, ok := d.strBytes()
	return ok && v.UnmarshalText(s) == nil
}

// Time reads an RFC 3339 time into *t. Text does the same through an interface,
// which makes *t escape to the heap (and with it the whole record it is a field of);
// this does not.
func (d *Decoder) Time(t *time.Time) bool {
	s, ok := d.strBytes()
	return ok && t.UnmarshalText(s) == nil
}

// Prefix reads an address prefix into *p, as Time does.
func (d *Decoder) Prefix(p *netip.Prefix) bool {
	s, ok := d.strBytes()
	return ok && p.UnmarshalText(s) == nil
}

// Addr reads an address into *a, as Time does.
func (d *Decoder) Addr(a *netip.Addr) bool {
	s, ok := d.strBytes()
	return ok && a.UnmarshalText(s) == nil
}

// Skippable reports whether encoding/json ignores key when decoding into a struct
// whose fields are named known: it matches field names case-insensitively (with
// Unicode folding, hence any non-ASCII key is refused here).
func Skippable(key string, known ...string) bool {
	for i := 0; i < len(key); i++ {
		if key[i] >= 0x80 {
			return false
		}
	}
	for _, k := range known {
		if strings.EqualFold(key, k) {
			return false
		}
	}
	return true
}

// Skip reads any JSON value other than null (escapes allowed) and returns its bytes.
// It checks the nesting, not every detail of the syntax: callers check the whole
// input with json.Valid first.
func (d *Decoder) Skip() ([]byte, bool) {
	d.ws()
	start := d.i
	depth := 0
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			d.i++
			for d.i < len(d.b) && d.b[d.i] != '"' {
				if d.b[d.i] == '\\' {
					d.i++
				}
				d.i++
			}
			if d.i >= len(d.b) {
				return nil, false
			}
			d.i++
		case c == '{' || c == '[':
			depth++
			d.i++
		case c == '}' || c == ']':
			if depth == 0 {
				return nil, false
			}
			depth--
			d.i++
		case c == ',' || c == ':' || c == ' ' || c == '\t' || c == '\n' || c == '\r':
			if depth == 0 {
				return nil, false
			}
			d.i++
		default: // numbers, true, false, null
			lit := d.i
			for d.i < len(d.b) && strings.IndexByte("-+.0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", d.b[d.i]) >= 0 {
				d.i++
			}
			if d.i == lit || string(d.b[lit:d.i]) == "null" {
				return nil, false
			}
		}
		if depth == 0 {
			return d.b[start:d.i], true
		}
	}
	return nil, false
}
