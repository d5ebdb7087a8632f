package etcdds

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/datastore"
)

// TestDecodeLease: a lease record reads with its addresses, and one written without
// (an agent that published none, an older release) reads with none.
func TestDecodeLease(t *testing.T) {
	cases := []struct {
		name, val string
		want      datastore.NodeLease
	}{
		{"without addresses", `{"holder":"node-a/1","ttlSeconds":20}`,
			datastore.NodeLease{Node: "node-a", Holder: "node-a/1", TTL: 20 * time.Second}},
		{"with addresses", `{"holder":"node-a/1","ttlSeconds":3,"addrs":["10.0.0.1","fd00::1"]}`,
			datastore.NodeLease{Node: "node-a", Holder: "node-a/1", TTL: 3 * time.Second,
				Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}}},
		{"unknown fields", `{"holder":"h","ttlSeconds":5,"zone":"x"}`,
			datastore.NodeLease{Node: "node-a", Holder: "h", TTL: 5 * time.Second}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := decodeLease("node-a", []byte(c.val))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("decodeLease(%s) = %+v, want %+v", c.val, got, c.want)
			}
		})
	}
	if _, err := decodeLease("node-a", []byte(`{"holder":"h","ttlSeconds":5,"addrs":["no"]}`)); err == nil {
		t.Fatal("a record with a bad address decoded")
	}
}

// TestLeaseValueWithoutAddrs: a lease published without addresses is written as
// an older release wrote it (no addrs field), so older agents read it unchanged.
func TestLeaseValueWithoutAddrs(t *testing.T) {
	b, err := json.Marshal(leaseValue{Holder: "h", TTLSeconds: 3})
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"holder":"h","ttlSeconds":3}` {
		t.Fatalf("lease record %s", b)
	}
}
