package store

// Record codecs without reflection for the ledger's most numerous records, leases and
// free addresses: ledger.Open decodes every one of them before the agent serves, where
// encoding/json's reflection would be most of the work, and every ADD and DEL encodes
// one or two records. The bytes are exactly those of encoding/json (which stays the
// format of the file); anything the jsonlite subset does not cover is left to
// encoding/json. codec_test.go checks both directions against it.

import (
	"encoding/json"
	"math"
	"net/netip"
	"strconv"
	"time"

	"github.com/ipledger/ipledger/internal/jsonlite"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
)

// MarshalRecord is json.Marshal(v), without reflection for leases, free addresses,
// history entries and pool records (every commit writes some of them).
func MarshalRecord(v any) ([]byte, error) {
	var b []byte
	ok := false
	switch r := v.(type) {
	case ledger.Lease:
		b, ok = appendLease(make([]byte, 0, 256), &r)
	case ledger.Free:
		b, ok = appendFree(make([]byte, 0, 128), &r)
	case ledger.Release:
		b, ok = appendRelease(make([]byte, 0, 256), &r)
	case ledger.PoolRecord:
		b, ok = appendPool(make([]byte, 0, 256), &r)
	case ledger.BlockRecord:
		b, ok = appendBlock(make([]byte, 0, 160), &r)
	}
	if ok {
		return b, nil
	}
	return json.Marshal(v)
}

// UnmarshalRecord is json.Unmarshal(data, into), without reflection for leases and
// free addresses.
func UnmarshalRecord(data []byte, into any) error {
	switch r := into.(type) {
	case *ledger.Lease:
		return UnmarshalLease(data, r, nil)
	case *ledger.Free:
		return UnmarshalFree(data, r, nil)
	}
	return json.Unmarshal(data, into)
}

func appendLease(b []byte, l *ledger.Lease) ([]byte, bool) {
	e := jsonlite.NewEncoder(b)
	first := true
	e.Raw("{")
	e.Field(&first, "key")
	l.Key.AppendJSON(&e)
	e.Field(&first, "pod")
	l.Pod.AppendJSON(&e)
	e.Field(&first, "netns")
	l.NetNS.AppendJSON(&e)
	e.Field(&first, "ips")
	if l.IPs == nil {
		e.Raw("null")
	} else {
		e.Raw("[")
		for i, p := range l.IPs {
			if i > 0 {
				e.Raw(",")
			}
			e.Text(p)
		}
		e.Raw("]")
	}
	e.Field(&first, "created")
	e.Time(l.Created)
	e.StrField(&first, "state", l.State, false)
	e.StrField(&first, "why", l.Why, true)
	if len(l.Borrowed) > 0 {
		e.Field(&first, "borrowed")
		e.Raw("[")
		for i, a := range l.Borrowed {
			if i > 0 {
				e.Raw(",")
			}
			e.Text(a)
		}
		e.Raw("]")
	}
	e.StrField(&first, "pool", l.Pool, true)
	e.StrField(&first, "bootID", l.BootID, true)
	if l.SinceBoot < 0 {
		return nil, false
	}
	e.UintField(&first, "sinceBoot", uint64(l.SinceBoot), true)
	e.Raw("}")
	return e.B, e.OK
}

func decodeLease(d *jsonlite.Decoder, l *ledger.Lease, in *Interner) bool {
	return d.Fields(func(k []byte) bool {
		switch string(k) {
		case "key":
			return d.Fields(func(k []byte) bool {
				switch string(k) {
				case "network":
					return in.set(d, &l.Key.Network)
				case "containerID":
					return d.SetStr(&l.Key.ContainerID)
				case "ifname":
					return in.set(d, &l.Key.IfName)
				}
				return false
			})
		case "pod":
			return d.Fields(func(k []byte) bool {
				switch string(k) {
				case "namespace":
					return in.set(d, &l.Pod.Namespace)
				case "name":
					return d.SetStr(&l.Pod.Name)
				case "uid":
					return d.SetStr(&l.Pod.UID)
				case "infraContainerID":
					// usually the container ID itself (containerd, CRI-O): share it
					b, ok := d.StrBytes()
					if ok && string(b) == l.Key.ContainerID {
						l.Pod.InfraContainerID = l.Key.ContainerID
					} else {
						l.Pod.InfraContainerID = string(b)
					}
					return ok
				}
				return false
			})
		case "netns":
			return d.Fields(func(k []byte) bool {
				var ok bool
				switch string(k) {
				case "path":
					ok = d.SetStr(&l.NetNS.Path)
				case "dev":
					l.NetNS.Dev, ok = d.Uint()
				case "ino":
					l.NetNS.Ino, ok = d.Uint()
				}
				return ok
			})
		case "ips":
			l.IPs = make([]netip.Prefix, 0, 1)
			return d.Array(func() bool {
				l.IPs = append(l.IPs, netip.Prefix{})
				return d.Prefix(&l.IPs[len(l.IPs)-1])
			})
		case "created":
			return d.Time(&l.Created)
		case "state":
			return in.set(d, &l.State)
		case "why":
			return in.set(d, &l.Why)
		case "borrowed":
			l.Borrowed = make([]netip.Addr, 0, 1)
			return d.Array(func() bool {
				l.Borrowed = append(l.Borrowed, netip.Addr{})
				return d.Addr(&l.Borrowed[len(l.Borrowed)-1])
			})
		case "pool":
			return in.set(d, &l.Pool)
		case "bootID":
			return in.set(d, &l.BootID)
		case "sinceBoot":
			v, ok := d.Uint()
			if !ok || v > math.MaxInt64 {
				return false
			}
			l.SinceBoot = time.Duration(v)
			return true
		}
		return false
	})
}

// Interner shares the strings that repeat across many records (network names,
// interface names, pod namespaces, lease states) while a store reads them all, so
// that the leases hold one copy of each rather than one per lease: fewer allocations
// at agent start and less heap for as long as the leases live. It holds at most
// internMax strings; past that it copies as a plain decode does. A nil *Interner
// interns nothing. Not safe for concurrent use: one per read.
type Interner struct{ m map[string]string }

const internMax = 4096

func (in *Interner) set(d *jsonlite.Decoder, p *string) bool {
	if in == nil {
		return d.SetStr(p)
	}
	b, ok := d.StrBytes()
	if !ok {
		return false
	}
	if s, hit := in.m[string(b)]; hit {
		*p = s
		return true
	}
	s := string(b)
	if in.m == nil {
		in.m = make(map[string]string, 16)
	}
	if len(in.m) < internMax {
		in.m[s] = s
	}
	*p = s
	return true
}

// UnmarshalLease is UnmarshalRecord for a lease record, sharing repeated strings
// through in (which may be nil).
func UnmarshalLease(data []byte, l *ledger.Lease, in *Interner) error {
	*l = ledger.Lease{}
	if d := jsonlite.NewDecoder(data); decodeLease(d, l, in) && d.End() {
		return nil
	}
	// into a variable of its own: passing l to encoding/json would put every caller's
	// lease on the heap, also on the fast path
	var v ledger.Lease
	err := json.Unmarshal(data, &v)
	*l = v
	return err
}

func appendFree(b []byte, f *ledger.Free) ([]byte, bool) {
	e := jsonlite.NewEncoder(b)
	first := true
	e.Raw("{")
	e.StrField(&first, "network", f.Network, false)
	e.Field(&first, "ip")
	e.Text(f.IP)
	e.Field(&first, "set")
	e.Int(int64(f.Set))
	e.Field(&first, "releasedAt")
	e.Time(f.ReleasedAt)
	e.UintField(&first, "seq", f.Seq, false)
	e.StrField(&first, "lastUID", f.LastUID, true)
	e.StrField(&first, "bootID", f.BootID, true)
	if f.SinceBoot < 0 {
		return nil, false
	}
	e.UintField(&first, "sinceBoot", uint64(f.SinceBoot), true)
	e.Raw("}")
	return e.B, e.OK
}

func decodeFree(d *jsonlite.Decoder, f *ledger.Free, in *Interner) bool {
	return d.Fields(func(k []byte) bool {
		var ok bool
		switch string(k) {
		case "network":
			ok = in.set(d, &f.Network)
		case "ip":
			ok = d.Addr(&f.IP)
		case "set":
			f.Set, ok = d.Int()
		case "releasedAt":
			ok = d.Time(&f.ReleasedAt)
		case "seq":
			f.Seq, ok = d.Uint()
		case "lastUID":
			ok = d.SetStr(&f.LastUID)
		case "bootID":
			ok = in.set(d, &f.BootID)
		case "sinceBoot":
			var v uint64
			if v, ok = d.Uint(); ok && v <= math.MaxInt64 {
				f.SinceBoot = time.Duration(v)
			} else {
				ok = false
			}
		}
		return ok
	})
}

// UnmarshalFree is UnmarshalRecord for a free-address record, sharing repeated
// strings through in (which may be nil).
func UnmarshalFree(data []byte, f *ledger.Free, in *Interner) error {
	*f = ledger.Free{}
	if d := jsonlite.NewDecoder(data); decodeFree(d, f, in) && d.End() {
		return nil
	}
	var v ledger.Free
	err := json.Unmarshal(data, &v)
	*f = v
	return err
}

// appendRelease writes an address's history entry, written by every release.
func appendRelease(b []byte, r *ledger.Release) ([]byte, bool) {
	e := jsonlite.NewEncoder(b)
	first := true
	e.Raw("{")
	e.StrField(&first, "network", r.Network, false)
	e.Field(&first, "ip")
	e.Text(r.IP)
	e.Field(&first, "key")
	r.Key.AppendJSON(&e)
	e.Field(&first, "pod")
	r.Pod.AppendJSON(&e)
	e.Field(&first, "from")
	e.Time(r.From)
	e.Field(&first, "to")
	e.Time(r.To)
	e.StrField(&first, "reason", string(r.Reason), false)
	e.StrField(&first, "detail", r.Detail, true)
	e.StrField(&first, "why", r.Why, true)
	e.UintField(&first, "seq", r.Seq, false)
	e.Raw("}")
	return e.B, e.OK
}

// appendPool writes a pool record, written by every commit that touches the pool.
func appendPool(b []byte, p *ledger.PoolRecord) ([]byte, bool) {
	e := jsonlite.NewEncoder(b)
	first := true
	e.Raw("{")
	e.StrField(&first, "network", p.Network, false)
	e.Field(&first, "ranges")
	if p.Ranges == nil {
		e.Raw("null")
	} else {
		pool.AppendRangeSets(&e, p.Ranges)
	}
	e.Field(&first, "created")
	e.Time(p.Created)
	e.Field(&first, "nextFresh")
	if p.NextFresh == nil {
		e.Raw("null")
	} else {
		e.Raw("[")
		for i, n := range p.NextFresh {
			if i > 0 {
				e.Raw(",")
			}
			e.B = strconv.AppendUint(e.B, n, 10)
		}
		e.Raw("]")
	}
	e.UintField(&first, "seq", p.Seq, false)
	e.UintField(&first, "allocations", p.Allocations, false)
	e.UintField(&first, "releases", p.Releases, false)
	if len(p.BlockBits) > 0 { // omitempty
		e.Field(&first, "blockBits")
		e.Raw("[")
		for i, n := range p.BlockBits {
			if i > 0 {
				e.Raw(",")
			}
			e.Int(int64(n))
		}
		e.Raw("]")
	}
	if len(p.Retired) > 0 { // omitempty
		e.Field(&first, "retired")
		pool.AppendRangeSets(&e, p.Retired)
	}
	e.UintField(&first, "rangeChanges", p.RangeChanges, true)
	if p.Replaced != nil { // omitempty; written once per replacement, kept after
		r, err := json.Marshal(p.Replaced)
		if err != nil {
			return nil, false
		}
		e.Field(&first, "replaced")
		e.B = append(e.B, r...)
	}
	e.Raw("}")
	return e.B, e.OK
}

// appendBlock writes a block record, written by every allocation that takes a
// never-used address of a block.
func appendBlock(b []byte, r *ledger.BlockRecord) ([]byte, bool) {
	e := jsonlite.NewEncoder(b)
	first := true
	e.Raw("{")
	e.StrField(&first, "network", r.Network, false)
	e.Field(&first, "prefix")
	e.Text(r.Prefix)
	e.Field(&first, "set")
	e.Int(int64(r.Set))
	e.UintField(&first, "epoch", r.Epoch, false)
	e.StrField(&first, "state", string(r.State), false)
	e.UintField(&first, "nextFresh", r.NextFresh, false)
	e.Field(&first, "added")
	e.Time(r.Added)
	e.Raw("}")
	return e.B, e.OK
}
