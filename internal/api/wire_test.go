package api

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/jsonlite"
	"github.com/ipledger/ipledger/internal/pool"
)

// plainStrings are written by json.Marshal as they are; oddStrings take the other
// paths of the string encoder and decoder: escaped by encoding/json, invalid UTF-8.
var (
	plainStrings = []string{"", "eth0", "net1", "kube-system", "ünïcode", "1234567890abcdef1234567890abcdef"}
	oddStrings   = []string{"a\"b", "back\\slash", "<html>&", "tab\there", "\u2028", "\xff\xfe", "del\x7f", "\ufffd"}
)

// randString is mostly plain, so that whole messages often take the fast path.
func randString(r *rand.Rand) string {
	if r.IntN(40) == 0 {
		return oddStrings[r.IntN(len(oddStrings))]
	}
	return plainStrings[r.IntN(len(plainStrings))]
}

func randRanges(r *rand.Rand) []pool.RangeSet {
	switch r.IntN(4) {
	case 0:
		return nil
	case 1:
		return []pool.RangeSet{}
	}
	var sets []pool.RangeSet
	for i := r.IntN(3); i >= 0; i-- {
		var set pool.RangeSet
		if r.IntN(8) == 0 {
			sets = append(sets, nil)
			continue
		}
		for j := r.IntN(2); j >= 0; j-- {
			rg := pool.Range{Subnet: netip.MustParsePrefix("10.1.0.0/22")}
			if r.IntN(6) == 0 {
				rg.Subnet = netip.MustParsePrefix("fd00::/64")
			}
			if r.IntN(10) == 0 {
				rg.Subnet = netip.Prefix{}
			}
			if r.IntN(2) == 0 {
				rg.RangeStart = netip.MustParseAddr("10.1.0.2")
				rg.RangeEnd = netip.MustParseAddr("10.1.3.254")
			}
			if r.IntN(2) == 0 {
				rg.Gateway = netip.MustParseAddr("10.1.0.1")
			}
			set = append(set, rg)
		}
		sets = append(sets, set)
	}
	return sets
}

func randRequest(r *rand.Rand) Request {
	req := Request{Version: r.IntN(3), Op: []string{OpAdd, OpDel, OpCheck, OpGC, "", "x<y"}[r.IntN(6)],
		Network: randString(r), ContainerID: randString(r), IfName: randString(r), Ranges: randRanges(r),
		IP: randString(r), Detail: randString(r)}
	if r.IntN(2) == 0 {
		req.Pod = Pod{Namespace: randString(r), Name: randString(r), UID: randString(r), InfraContainerID: randString(r)}
	}
	if r.IntN(2) == 0 {
		req.NetNS = NetNS{Path: randString(r), Dev: uint64(r.IntN(3)) * 1e18, Ino: r.Uint64() >> r.IntN(64)}
	}
	switch r.IntN(3) {
	case 0:
		req.Valid = []Attachment{}
	case 1:
		req.Valid = []Attachment{{ContainerID: randString(r), IfName: randString(r)}, {}}
	}
	switch r.IntN(3) {
	case 0:
		req.IPs = []string{}
	case 1:
		req.IPs = []string{randString(r), "10.1.0.2/22"}
	}
	if r.IntN(3) == 0 {
		c := &CNICall{Command: []string{"ADD", "DEL", ""}[r.IntN(3)], ContainerID: randString(r), NetNS: randString(r),
			IfName: randString(r), Args: randString(r), Path: randString(r), NetNSOverride: randString(r), Stdin: randBytes(r)}
		if r.IntN(2) == 0 {
			c.NetNSID = NetNS{Path: randString(r), Dev: uint64(r.IntN(3)), Ino: r.Uint64() >> r.IntN(64)}
			c.SelfNetNS = NetNS{Dev: 4, Ino: 4026531840}
		}
		req.CNI = c
	}
	return req
}

// randBytes is nil, empty, a network configuration, or bytes of every value.
func randBytes(r *rand.Rand) []byte {
	switch r.IntN(4) {
	case 0:
		return nil
	case 1:
		return []byte{}
	case 2:
		return []byte(`{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ipledger","ranges":[[{"subnet":"10.1.0.0/22"}]]}}` + "\n")
	}
	b := make([]byte, r.IntN(70))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func randResponse(r *rand.Rand) *Response {
	resp := &Response{Version: r.IntN(3), Released: r.IntN(3), Existed: r.IntN(2) == 0}
	if r.IntN(3) == 0 {
		resp.Error = &Error{Code: CodeExhausted, Msg: randString(r)}
	}
	if r.IntN(2) == 0 {
		created := []time.Time{time.Date(2026, 11, 23, 11, 27, 43, 594468764, time.UTC), {},
			time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 5*3600+1800)),
			time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
			time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("y", 25*3600))}[r.IntN(5)]
		v := &LeaseView{Network: randString(r), ContainerID: randString(r), IfName: randString(r),
			Namespace: randString(r), Name: randString(r), UID: randString(r), Infra: randString(r),
			NetNS: randString(r), NetNSID: randString(r), Created: created, State: randString(r),
			Sandbox: randString(r), Suspect: randString(r)}
		switch r.IntN(3) {
		case 0:
			v.IPs = []string{}
		case 1:
			v.IPs, v.Gateways = []string{"10.1.0.2/22", randString(r)}, []string{"10.1.0.1", ""}
		}
		resp.Lease = v
	}
	switch r.IntN(6) {
	case 0:
		resp.Leases = []LeaseView{}
	case 1:
		resp.Pool = &PoolStatus{}
	}
	if r.IntN(3) == 0 {
		resp.CNI = &CNIAnswer{Exit: r.IntN(3), Stdout: randBytes(r), Stderr: randBytes(r)}
	}
	return resp
}

// TestWireEncodeMatchesJSON: the hand-written encoders give exactly json.Marshal's
// bytes (or its error) for requests and responses of every shape.
func TestWireEncodeMatchesJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	fast, fastLease := 0, 0
	for i := 0; i < 5000; i++ {
		req := randRequest(r)
		want, werr := json.Marshal(req)
		got, gerr := MarshalRequest(req)
		if !bytes.Equal(got, want) || (werr == nil) != (gerr == nil) {
			t.Fatalf("request %#v:\n got %s (%v)\nwant %s (%v)", req, got, gerr, want, werr)
		}
		if _, ok := appendRequest(nil, &req); ok {
			fast++
		}
		resp := randResponse(r)
		if _, ok := appendResponse(nil, resp); ok && resp.Lease != nil {
			fastLease++
		}
		want, werr = json.Marshal(resp)
		got, gerr = MarshalResponse(resp)
		if !bytes.Equal(got, want) || (werr == nil) != (gerr == nil) {
			t.Fatalf("response %#v:\n got %s (%v)\nwant %s (%v)", resp, got, gerr, want, werr)
		}
	}
	if fast < 300 || fastLease < 300 {
		t.Fatalf("only %d requests and %d answers with a lease took the hand-written path", fast, fastLease)
	}
}

// checkDecode decodes data with the hand-written decoders and with encoding/json and
// fails unless both agree (value, or both an error).
func checkDecode(t *testing.T, data []byte) {
	t.Helper()
	var gotReq, wantReq Request
	gerr, werr := UnmarshalRequest(data, &gotReq), json.Unmarshal(data, &wantReq)
	if (gerr == nil) != (werr == nil) || (werr == nil && !reflect.DeepEqual(gotReq, wantReq)) {
		t.Fatalf("request %q:\n got %#v (%v)\nwant %#v (%v)", data, gotReq, gerr, wantReq, werr)
	}
	var gotResp, wantResp Response
	gerr, werr = UnmarshalResponse(data, &gotResp), json.Unmarshal(data, &wantResp)
	if (gerr == nil) != (werr == nil) || (werr == nil && !reflect.DeepEqual(gotResp, wantResp)) {
		t.Fatalf("response %q:\n got %#v (%v)\nwant %#v (%v)", data, gotResp, gerr, wantResp, werr)
	}
}

// TestWireDecodeMatchesJSON: the hand-written decoders agree with json.Unmarshal on
// what the encoders write and on hand-picked inputs outside their subset.
func TestWireDecodeMatchesJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 5000; i++ {
		req := randRequest(r)
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		checkDecode(t, b)
		if b, err = json.Marshal(randResponse(r)); err == nil {
			checkDecode(t, b)
		}
	}
	for _, s := range wireCorpus {
		checkDecode(t, []byte(s))
	}
}

// TestWireDecodeFastPath: the answers and requests of ADD and DEL as the agent and
// plugin write them take the hand-written path (the point of wire.go).
func TestWireDecodeFastPath(t *testing.T) {
	cni := []string{
		`{"version":1,"op":"cni","cni":{"command":"ADD","containerID":"c","netns":"/run/netns/x","ifname":"eth0","args":"K8S_POD_NAME=p","path":"/opt/cni/bin","stdin":"e30K","netnsID":{"path":"/run/netns/x","dev":4,"ino":4026532},"selfNetNS":{"path":"/proc/self/ns/net","dev":4,"ino":4026531840}}}`,
		`{"version":1,"released":0,"cni":{"exit":0,"stdout":"e30K","stderr":""}}`,
		`{"version":1,"released":0,"cni":{"exit":1,"stdout":"e30K","stderr":null}}`,
	}
	for _, s := range append([]string{wireCorpus[0], wireCorpus[1], wireCorpus[2], wireCorpus[3]}, cni...) {
		var req Request
		var resp Response
		d1, d2 := jsonlite.NewDecoder([]byte(s)), jsonlite.NewDecoder([]byte(s))
		if !(decodeRequest(d1, &req) && d1.End()) && !(decodeResponse(d2, &resp) && d2.End()) {
			t.Errorf("%s: left to encoding/json", s)
		}
	}
}

var wireCorpus = []string{
	`{"version":1,"op":"add","network":"n","containerID":"c","ifname":"eth0","ranges":[[{"subnet":"10.1.0.0/22","rangeStart":"10.1.0.2","rangeEnd":"10.1.3.254","gateway":"10.1.0.1"}]],"pod":{"namespace":"ns","name":"p","uid":"u"},"netns":{"path":"/run/netns/x","dev":4,"ino":4026532}}`,
	`{"version":1,"op":"del","network":"n","containerID":"c","ifname":"eth0"}`,
	`{"version":1,"lease":{"network":"n","containerID":"c","ifname":"eth0","ips":["10.1.0.2/22"],"gateways":["10.1.0.1"],"created":"2026-11-23T11:27:43.594468764Z","state":"active"},"released":0}`,
	`{"version":1,"error":{"code":"exhausted","msg":"pool exhausted"},"released":0}`,
	` { "version" : 1 , "released" : 1 } `,
	`{"Version":1,"OP":"add"}`,
	`{"version":1,"version":2}`,
	`{"version":1.0}`, `{"version":1e0}`, `{"version":-1}`, `{"version":01}`, `{"version":99999999999999999999}`,
	`{"version":null}`, `{"lease":null}`, `{"error":null}`, `{"ranges":null}`, `{"ranges":[null]}`, `{"ranges":[[null]]}`,
	`{"op":"a\u0062"}`, `{"op":"\ud800"}`, "{\"op\":\"\xff\"}", "{\"op\":\"a\nb\"}", `{"op":1}`, `{"op":"x"`, `{"op":"x"}x`,
	`{"ranges":[[{"subnet":"bad"}]]}`, `{"ranges":[[{"subnet":""}]]}`, `{"ranges":[[{"subnet":"10.0.0.0/8","gateway":""}]]}`,
	`{"ranges":[[{"subnet":"10.0.0.0/8","gateway":"1.2.3"}]]}`, `{"ranges":[]}`, `{"ranges":[[]]}`,
	`{"netns":{"dev":18446744073709551615}}`, `{"netns":{"dev":18446744073709551616}}`, `{"netns":{"ino":-1}}`,
	`{"valid":[]}`, `{"valid":[{"containerID":"a","ifname":"b","x":1}]}`, `{"ips":[]}`, `{"ips":["a",1]}`,
	`{"unknown":{"deep":[1,2,{"x":null}]}}`, `{"existed":true}`, `{"existed":tru}`, `{"existed":1}`,
	`{"lease":{"created":"2026-11-23T11:27:43Z"}}`, `{"lease":{"created":"2026-11-23T11:27:43+05:30"}}`,
	`{"lease":{"created":"2026-11-23 11:27:43"}}`, `{"lease":{"ips":[]}}`, `{"lease":{}}`, `{"error":{}}`,
	`{"cni":{"command":"ADD","stdin":"e30K"}}`, `{"cni":{"command":"ADD","stdin":"e30"}}`, `{"cni":{"command":"ADD","stdin":"e3 0K"}}`,
	`{"cni":{"stdin":""}}`, `{"cni":{"stdin":null}}`, `{"cni":{"stdin":"@@@@"}}`, `{"cni":{"exit":1,"stdout":"e30K","stderr":""}}`,
	`{"cni":{"exit":-1}}`, `{"cni":{"netnsID":{"dev":1,"ino":2},"selfNetNS":{"path":"x"}}}`, `{"cni":null}`, `{"cni":{"x":1}}`,
	`{"leases":[]}`, `{"pool":{}}`, `{}`, ``, `[]`, `null`, `{"released":2147483648}`,
}

// FuzzWireDecode: on any input the hand-written decoders agree with encoding/json.
func FuzzWireDecode(f *testing.F) {
	for _, s := range wireCorpus {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkDecode(t, data) })
}
