package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"
	"time"
	"unsafe"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
)

var (
	plainStrings = []string{"", "net1", "0123456789abcdef", "kube-system", "ünïcode", "/var/run/netns/cni-1"}
	oddStrings   = []string{"a\"b", "<&>", "tab\t", "\xff", "\u2028", "\ufffd"}
	codecTimes   = []time.Time{time.Date(2026, 11, 23, 11, 27, 43, 594468764, time.UTC), {},
		time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", -(5*3600+1800))), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}
	codecPrefixes = []netip.Prefix{netip.MustParsePrefix("10.20.0.2/16"), netip.MustParsePrefix("fd00::5/64"), {}}
)

func randStr(r *rand.Rand) string {
	if r.IntN(30) == 0 {
		return oddStrings[r.IntN(len(oddStrings))]
	}
	return plainStrings[r.IntN(len(plainStrings))]
}

func randLease(r *rand.Rand) ledger.Lease {
	l := ledger.Lease{Key: ledger.Key{Network: randStr(r), ContainerID: randStr(r), IfName: randStr(r)},
		Pod:     ledger.Pod{Namespace: randStr(r), Name: randStr(r), UID: randStr(r), InfraContainerID: randStr(r)},
		NetNS:   ledger.NetNS{Path: randStr(r), Dev: uint64(r.IntN(2)) * 64769, Ino: r.Uint64() >> r.IntN(64)},
		Created: codecTimes[r.IntN(len(codecTimes))], State: randStr(r)}
	if r.IntN(2) == 0 {
		l.BootID, l.SinceBoot = randStr(r), time.Duration(r.Int64()>>r.IntN(64))*time.Duration(1-2*r.IntN(2))
	}
	switch r.IntN(4) {
	case 0:
	case 1:
		l.IPs = []netip.Prefix{}
	default:
		for i := r.IntN(3); i >= 0; i-- {
			l.IPs = append(l.IPs, codecPrefixes[r.IntN(len(codecPrefixes))])
		}
	}
	return l
}

func randFree(r *rand.Rand) ledger.Free {
	return ledger.Free{Network: randStr(r), IP: codecPrefixes[r.IntN(len(codecPrefixes))].Addr(), Set: r.IntN(3) - 1,
		ReleasedAt: codecTimes[r.IntN(len(codecTimes))], Seq: r.Uint64() >> r.IntN(64), LastUID: randStr(r),
		BootID: randStr(r), SinceBoot: time.Duration(r.Int64()>>r.IntN(64)) * time.Duration(1-2*r.IntN(2))}
}

func randRelease(r *rand.Rand) ledger.Release {
	return ledger.Release{Network: randStr(r), IP: codecPrefixes[r.IntN(len(codecPrefixes))].Addr(),
		Key: ledger.Key{Network: randStr(r), ContainerID: randStr(r), IfName: randStr(r)},
		Pod: ledger.Pod{Namespace: randStr(r), UID: randStr(r)}, From: codecTimes[r.IntN(len(codecTimes))],
		To: codecTimes[r.IntN(len(codecTimes))], Reason: ledger.Reason(randStr(r)), Detail: randStr(r), Seq: r.Uint64() >> r.IntN(64)}
}

func randPool(r *rand.Rand) ledger.PoolRecord {
	p := ledger.PoolRecord{Network: randStr(r), Created: codecTimes[r.IntN(len(codecTimes))], Seq: r.Uint64() >> r.IntN(64),
		Allocations: uint64(r.IntN(1000)), Releases: uint64(r.IntN(1000))}
	switch r.IntN(3) {
	case 1:
		p.Ranges, p.NextFresh = []pool.RangeSet{}, []uint64{}
	case 2:
		p.Ranges = []pool.RangeSet{{{Subnet: netip.MustParsePrefix("10.20.0.0/16"), RangeStart: netip.MustParseAddr("10.20.0.2"),
			RangeEnd: netip.MustParseAddr("10.20.255.254"), Gateway: netip.MustParseAddr("10.20.0.1")}}, {{Subnet: netip.MustParsePrefix("fd00::/64")}}, nil}
		p.NextFresh = []uint64{r.Uint64() >> r.IntN(64), 0}
		if r.IntN(2) == 1 {
			p.Retired = []pool.RangeSet{{{Subnet: netip.MustParsePrefix("10.21.0.0/24"), RangeStart: netip.MustParseAddr("10.21.0.1"),
				RangeEnd: netip.MustParseAddr("10.21.0.254"), Gateway: netip.MustParseAddr("10.21.0.1")}}}
			p.RangeChanges = r.Uint64() >> r.IntN(64)
		}
	}
	return p
}

// TestRecordEncodeMatchesJSON: history entries and pool records, written by commits
// but read only by operators, are written byte for byte as encoding/json writes them.
func TestRecordEncodeMatchesJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	fast := 0
	for i := 0; i < 3000; i++ {
		for _, v := range []any{randRelease(r), randPool(r)} {
			want, werr := json.Marshal(v)
			got, gerr := MarshalRecord(v)
			if !bytes.Equal(got, want) || (werr == nil) != (gerr == nil) {
				t.Fatalf("%#v:\n got %s (%v)\nwant %s (%v)", v, got, gerr, want, werr)
			}
		}
		rel, p := randRelease(r), randPool(r)
		if _, ok := appendRelease(nil, &rel); ok {
			fast++
		}
		if _, ok := appendPool(nil, &p); ok {
			fast++
		}
	}
	if fast < 1000 {
		t.Fatalf("only %d records took the hand-written path", fast)
	}
}

// checkRecord encodes v (a Lease or Free) with MarshalRecord and json.Marshal and
// decodes the bytes with UnmarshalRecord and json.Unmarshal; both pairs must agree.
func checkRecord[T any](t *testing.T, v T) (fast bool) {
	t.Helper()
	want, werr := json.Marshal(v)
	got, gerr := MarshalRecord(v)
	if !bytes.Equal(got, want) || (werr == nil) != (gerr == nil) {
		t.Fatalf("%#v:\n got %s (%v)\nwant %s (%v)", v, got, gerr, want, werr)
	}
	if werr == nil {
		checkDecode[T](t, want)
	}
	switch r := any(v).(type) {
	case ledger.Lease:
		_, fast = appendLease(nil, &r)
	case ledger.Free:
		_, fast = appendFree(nil, &r)
	}
	return fast
}

func checkDecode[T any](t *testing.T, data []byte) {
	t.Helper()
	var got, want T
	gerr, werr := UnmarshalRecord(data, &got), json.Unmarshal(data, &want)
	if (gerr == nil) != (werr == nil) || (werr == nil && !reflect.DeepEqual(got, want)) {
		t.Fatalf("%q:\n got %#v (%v)\nwant %#v (%v)", data, got, gerr, want, werr)
	}
	// the same through the interning readers a store's ForEachLease and ForEachFree
	// use, sharing one Interner across every input of the test
	var interned any
	var ierr error
	switch any(&got).(type) {
	case *ledger.Lease:
		var l ledger.Lease
		ierr, interned = UnmarshalLease(data, &l, &testInterner), l
	case *ledger.Free:
		var f ledger.Free
		ierr, interned = UnmarshalFree(data, &f, &testInterner), f
	default:
		return
	}
	if (ierr == nil) != (werr == nil) || (werr == nil && !reflect.DeepEqual(interned, any(want))) {
		t.Fatalf("%q (interned):\n got %#v (%v)\nwant %#v (%v)", data, interned, ierr, want, werr)
	}
}

var testInterner Interner

// TestInternerShares: records read through one Interner share their repeated strings
// (the memory an agent saves at 64k leases) and keep their unique ones apart.
func TestInternerShares(t *testing.T) {
	var in Interner
	var first ledger.Lease
	for i := 0; i < 3; i++ {
		data := fmt.Sprintf(`{"key":{"network":"net","containerID":"c%d","ifname":"eth0"},"pod":{"namespace":"default","name":"p%d","uid":"u%d","infraContainerID":"c%d"},"netns":{"path":"/run/netns/x%d"},"ips":["10.20.0.%d/16"],"created":"2026-11-23T11:27:43Z","state":"active"}`, i, i, i, i, i, i+2)
		var l ledger.Lease
		if err := UnmarshalLease([]byte(data), &l, &in); err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprint("c", i); l.Key.ContainerID != want || l.Pod.InfraContainerID != want || l.Pod.Name != fmt.Sprint("p", i) {
			t.Fatalf("record %d read as %+v", i, l)
		}
		if i == 0 {
			first = l
			continue
		}
		for _, p := range [][2]string{{l.Key.Network, first.Key.Network}, {l.Key.IfName, first.Key.IfName}, {l.Pod.Namespace, first.Pod.Namespace}, {l.State, first.State}} {
			if unsafe.StringData(p[0]) != unsafe.StringData(p[1]) {
				t.Errorf("record %d: %q is a copy, not shared with the first record's", i, p[0])
			}
		}
		if unsafe.StringData(l.Pod.InfraContainerID) != unsafe.StringData(l.Key.ContainerID) {
			t.Errorf("record %d: infraContainerID is a copy of the container ID", i)
		}
	}
}

// TestRecordCodecMatchesJSON: leases and free addresses are written byte for byte as
// encoding/json writes them and read back as it reads them, and most take the
// hand-written path.
func TestRecordCodecMatchesJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	fastLeases, fastFrees := 0, 0
	for i := 0; i < 5000; i++ {
		if checkRecord(t, randLease(r)) {
			fastLeases++
		}
		if checkRecord(t, randFree(r)) {
			fastFrees++
		}
	}
	if fastLeases < 1000 || fastFrees < 1000 {
		t.Fatalf("only %d leases and %d free records took the hand-written path", fastLeases, fastFrees)
	}
	for _, s := range codecCorpus {
		checkDecode[ledger.Lease](t, []byte(s))
		checkDecode[ledger.Free](t, []byte(s))
	}
}

var codecCorpus = []string{
	`{"key":{"network":"n","containerID":"c","ifname":"eth0"},"pod":{"namespace":"ns","name":"p","uid":"u"},"netns":{},"ips":["10.20.0.2/16"],"created":"2026-11-23T11:27:43.594468764Z","state":"active"}`,
	`{"key":{"network":"n","containerID":"c","ifname":"eth0"},"pod":{},"netns":{},"ips":["10.20.0.2/16"],"created":"2026-11-23T11:27:43Z","state":"active","bootID":"9b1c","sinceBoot":3600000000000}`,
	`{"network":"n","ip":"10.20.0.9","set":0,"releasedAt":"2026-11-23T11:27:43Z","seq":7,"lastUID":"u"}`,
	`{"key":null}`, `{"ips":null}`, `{"ips":[null]}`, `{"ips":["10.20.0.2"]}`, `{"ips":[""]}`, `{"IPS":[]}`,
	`{"sinceBoot":-5}`, `{"sinceBoot":9223372036854775808}`, `{"sinceBoot":1.5}`, `{"bootID":"a","sinceBoot":120000000000}`,
	`{"set":-1}`, `{"set":1.5}`, `{"seq":18446744073709551616}`, `{"ip":""}`, `{"ip":"1.2.3.4.5"}`,
	`{"created":"2026-11-23"}`, `{"key":{"network":"a","network":"b"}}`, `{"state":"a\u0062"}`, `{"x":1}`, `{}`, ``, `[]`,
}

// FuzzRecordDecode: on any input the record decoders agree with encoding/json.
func FuzzRecordDecode(f *testing.F) {
	for _, s := range codecCorpus {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecode[ledger.Lease](t, data)
		checkDecode[ledger.Free](t, data)
	})
}
