package api

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"reflect"
	"testing"

	"github.com/ipledger/ipledger/internal/jsonlite/fieldtest"
	"github.com/ipledger/ipledger/internal/pool"
)

func sameAsJSON(t *testing.T, what string, got []byte, err error, v any) {
	t.Helper()
	want, jerr := json.Marshal(v)
	if err != nil || jerr != nil || !bytes.Equal(got, want) {
		t.Errorf("%s with every field set:\n got %s (%v)\nwant %s (%v)", what, got, err, want, jerr)
	}
}

// Every field of the hot-path messages, including ones added after the hand-written
// encoders, reaches the wire exactly as json.Marshal writes it.
func TestWireEncodesEveryField(t *testing.T) {
	var req Request
	fieldtest.Fill(t, reflect.ValueOf(&req))
	req.Ranges = []pool.RangeSet{{{Subnet: netip.MustParsePrefix("10.1.2.0/24"), Gateway: netip.MustParseAddr("10.1.2.1")}}, {{PodCIDR: 6}}}
	b, err := MarshalRequest(req)
	sameAsJSON(t, "Request", b, err, req)

	lease := &LeaseView{}
	fieldtest.Fill(t, reflect.ValueOf(lease))
	for _, resp := range []*Response{
		{Version: Version, Lease: lease, Released: 1, Existed: true},
		{Version: Version, Error: &Error{Code: CodeInvalid, Msg: "x"}},
	} {
		b, err := MarshalResponse(resp)
		sameAsJSON(t, "Response", b, err, resp)
	}
	var all Response
	fieldtest.Fill(t, reflect.ValueOf(&all))
	b, err = MarshalResponse(&all)
	sameAsJSON(t, "Response (every field)", b, err, &all)

	// a response of one kind only, for each kind the hot path does not write itself
	rv := reflect.ValueOf(&all).Elem()
	for i := range rv.NumField() {
		f := rv.Type().Field(i)
		if f.Type.Kind() != reflect.Pointer && f.Type.Kind() != reflect.Slice {
			continue
		}
		one := Response{Version: Version}
		reflect.ValueOf(&one).Elem().Field(i).Set(rv.Field(i))
		b, err := MarshalResponse(&one)
		sameAsJSON(t, "Response with only "+f.Name, b, err, &one)
	}

	var pod Pod
	fieldtest.Fill(t, reflect.ValueOf(&pod))
	b, err = MarshalRequest(Request{Version: Version, Op: OpAdd, Pod: pod})
	sameAsJSON(t, "Request.Pod", b, err, Request{Version: Version, Op: OpAdd, Pod: pod})
}

// The protocol's JSON is a contract twice over: between plugin and agent of one
// release, and as `ipledgerctl -o json|yaml` (sigs.k8s.io/yaml writes the JSON's
// names). Every field name and encoding of a request and an answer, set and unset, is
// written out here: renaming a field or changing its type or omission fails this test.
func TestWireFieldNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    any
		want string
	}{
		{"Request, every field set", func() any {
			var req Request
			fieldtest.Fill(t, reflect.ValueOf(&req))
			return req
		}(), `{"version":1,"op":"x","network":"x","containerID":"x","ifname":"x",` +
			`"ranges":[[{"subnet":"10.1.2.3/32","rangeStart":"10.1.2.3","rangeEnd":"10.1.2.3","gateway":"10.1.2.3","usePodCidr":1}]],"blockSize":1,"exclude":["x"],` +
			`"pod":{"namespace":"x","name":"x","uid":"x","infraContainerID":"x"},"netns":{"path":"x","dev":1,"ino":1},` +
			`"valid":[{"containerID":"x","ifname":"x"}],"ips":["x"],"ip":"x","detail":"x","forceReadySandbox":true,` +
			`"cni":{"command":"x","containerID":"x","netns":"x","ifname":"x","args":"x","path":"x","netnsOverride":"x","stdin":"AQ==",` +
			`"netnsID":{"path":"x","dev":1,"ino":1},"selfNetNS":{"path":"x","dev":1,"ino":1}}}`},
		{"Request, unset", Request{CNI: &CNICall{}}, `{"version":0,"op":"","cni":{"command":"","stdin":null}}`},
		{"Response, every field set", func() any {
			var resp Response
			fieldtest.Fill(t, reflect.ValueOf(&resp))
			return &resp
		}(), `{"version":1,"error":{"code":"x","msg":"x"},` +
			`"lease":` + leaseJSON + `,"leases":[` + leaseJSON + `],` +
			`"audit":{"ok":true,"live":1,"suspect":1,"stranded":1,"leaked":1,"doubleAssigned":1,"runtime":"x","problems":["x"],` +
			`"doubles":[{"network":"x","ip":"10.1.2.3","holders":[{"network":"x","containerID":"x","ifname":"x"}]}],` +
			`"suspectLeases":[` + leaseJSON + `],"pools":[{"network":"x","allocations":1,"releases":1,"live":1,"free":1,"drained":["x"],"draining":[{"block":"x","leases":1,"pods":["x"],"rangeInPool":true}]}]},` +
			`"history":[{"network":"x","ip":"10.1.2.3","key":{"network":"x","containerID":"x","ifname":"x"},` +
			`"pod":{"namespace":"x","name":"x","uid":"x","infraContainerID":"x"},"from":"2026-11-23T10:00:00Z","to":"2026-11-23T10:00:00Z",` +
			`"reason":"x","detail":"x","why":"x","seq":1}],` +
			`"pool":{"network":"x","ranges":[[{"subnet":"10.1.2.3/32","rangeStart":"10.1.2.3","rangeEnd":"10.1.2.3","gateway":"10.1.2.3","usePodCidr":1}]],` +
			`"usable":[1],"inUse":1,"free":1,"available":true,"allocations":1,"releases":1,` +
			`"retired":[{"ranges":[{"subnet":"10.1.2.3/32","rangeStart":"10.1.2.3","rangeEnd":"10.1.2.3","gateway":"10.1.2.3","usePodCidr":1}],"leases":1}],` +
			`"replaced":{"at":"2026-11-23T10:00:00Z","fromRanges":[[{"subnet":"10.1.2.3/32","rangeStart":"10.1.2.3","rangeEnd":"10.1.2.3","gateway":"10.1.2.3","usePodCidr":1}]],` +
			`"fromBlockBits":[1],"reason":"x"},"blockBits":[1]},` +
			`"doctor":{"runtime":"x","runtimeVersion":"x","runtimeError":"x","spoolBacklog":1,` +
			`"pools":[{"network":"x","usable":1,"inUse":1,"cooling":1,"exhausted":true,"mostUsed":1}],` +
			`"notReady":[{"id":"x","namespace":"x","name":"x","created":"2026-11-23T10:00:00Z"}],"booksBalanced":true,"problems":["x"],` +
			`"clockSteps":1,"lastStep":"x","now":"2026-11-23T10:00:00Z","clusterChecks":[{"level":"x","text":"x"}],"networkChecks":[{"level":"x","text":"x"}]},` +
			`"cluster":{"node":"x","datastore":"x","degraded":true,"reason":"x",` +
			`"blocks":[{"network":"x","block":"x","owner":"x","epoch":1,"state":"x","used":1,"free":1,` +
			`"borrows":[{"addr":"x","for":"x","node":"x"}]}]},` +
			`"released":1,"existed":true,"cni":{"exit":1,"stdout":"AQ==","stderr":"AQ=="}}`},
		{"Response, unset", func() any {
			var resp Response
			resp.Lease, resp.Audit, resp.Pool = &LeaseView{}, &Audit{}, new(PoolStatus)
			resp.Audit.Doubles, resp.Audit.Pools, resp.History = make([]DoubleAssigned, 1), make([]PoolAudit, 1), make([]Release, 1)
			return &resp
		}(), `{"version":0,"lease":{"network":"","containerID":"","ifname":"","ips":null,"created":"0001-01-01T00:00:00Z","state":""},` +
			`"audit":{"ok":false,"live":0,"suspect":0,"stranded":0,"leaked":0,"doubleAssigned":0,"runtime":"","problems":null,` +
			`"doubles":[{"network":"","ip":"","holders":null}],"pools":[{"network":"","allocations":0,"releases":0,"live":0,"free":0}]},` +
			`"history":[{"network":"","ip":"","key":{"network":"","containerID":"","ifname":""},"pod":{},` +
			`"from":"0001-01-01T00:00:00Z","to":"0001-01-01T00:00:00Z","reason":"","seq":0}],` +
			`"pool":{"network":"","ranges":null,"usable":null,"inUse":0,"free":0,"available":false,"allocations":0,"releases":0},"released":0}`},
	} {
		got, err := json.Marshal(tc.v)
		if err != nil || string(got) != tc.want {
			t.Errorf("%s:\n got %s (%v)\nwant %s", tc.name, got, err, tc.want)
		}
	}
}

const leaseJSON = `{"network":"x","containerID":"x","ifname":"x","ips":["x"],"gateways":["x"],"namespace":"x","name":"x","uid":"x",` +
	`"infraContainerID":"x","netns":"x","netnsID":"x","created":"2026-11-23T10:00:00Z","state":"x","why":"x","pool":"x","sandbox":"x",` +
	`"suspect":"x","verdict":"x","block":"x","lost":true,"podPhase":"x","podInAPI":"x"}`
