package api

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
)

// TestPodCIDRPlaceholderCrossesTheWire: the plugin sends a usePodCidr range as it
// parsed it, and the agent reads back the same placeholder, through the hand-written
// codec and through encoding/json alike.
func TestPodCIDRPlaceholderCrossesTheWire(t *testing.T) {
	sets := ledgertest.Ranges(t, `[[{"subnet":"usePodCidr"}],[{"subnet":"usePodCidrIPv6"}],[{"subnet":"fd00:9::/64"}]]`)
	req := Request{Version: 1, Op: "ADD", Network: "k8s", ContainerID: "c1", IfName: "eth0", Ranges: sets}
	b, err := MarshalRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	var got Request
	if err := UnmarshalRequest(b, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Ranges, sets) {
		t.Fatalf("hand-written codec: %s\n got %+v\nwant %+v", b, got.Ranges, sets)
	}
	var viaJSON Request
	if err := json.Unmarshal(b, &viaJSON); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(viaJSON.Ranges, sets) {
		t.Fatalf("encoding/json: %s\n got %+v\nwant %+v", b, viaJSON.Ranges, sets)
	}
}
