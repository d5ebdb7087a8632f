package api

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"reflect"
	"testing"

	"github.com/ipledger/ipledger/internal/jsonlite/fieldtest"
	"github.com/ipledger/ipledger/internal/ledger"
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
	req.Ranges = []pool.RangeSet{{{Subnet: netip.MustParsePrefix("10.1.2.0/24"), Gateway: netip.MustParseAddr("10.1.2.1")}}}
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

	var pod ledger.Pod
	fieldtest.Fill(t, reflect.ValueOf(&pod))
	b, err = MarshalRequest(Request{Version: Version, Op: OpAdd, Pod: pod})
	sameAsJSON(t, "Request.Pod", b, err, Request{Version: Version, Op: OpAdd, Pod: pod})
}
