package datastore_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/datastore"
)

func TestCheckKey(t *testing.T) {
	long := strings.Repeat("a", datastore.MaxName)
	ok := []string{
		"pools/net1",
		"blocks/net1/10-0-0-64-26",
		"blocks/net1/fd00--40-122",
		"blocks/my.net-2/10-0-0-0-26",
		"pools/" + long,
		"blocks/" + long[:100] + "/" + long[:152], // 253 bytes together
	}
	for _, k := range ok {
		if err := datastore.CheckKey(k); err != nil {
			t.Errorf("CheckKey(%q): %v, want nil", k, err)
		}
	}
	bad := []string{"", "pools", "pools/", "/pools/a", "pools/a/", "pools//a", "Pools/a", "pools/A",
		"pools/a_b", "pools/" + long + "a", "blocks/" + long[:100] + "/" + long[:153], "nodes/n1", "9pools/a", "blocks/net1/fd00::40"}
	for _, k := range bad {
		err := datastore.CheckKey(k)
		if !errors.Is(err, datastore.ErrInvalid) {
			t.Errorf("CheckKey(%q): %v, want ErrInvalid", k, err)
		} else if !strings.Contains(err.Error(), "key") {
			t.Errorf("CheckKey(%q): %v does not say it is the key", k, err)
		}
	}
}

func TestCheckPrefix(t *testing.T) {
	for _, p := range []string{"pools/", "blocks/", "blocks/net1/", "blocks/a.b/c/"} {
		if err := datastore.CheckPrefix(p); err != nil {
			t.Errorf("CheckPrefix(%q): %v", p, err)
		}
	}
	for _, p := range []string{"", "/", "blocks", "blocks/net1", "blocks//", "Blocks/", "nodes/"} {
		if err := datastore.CheckPrefix(p); !errors.Is(err, datastore.ErrInvalid) {
			t.Errorf("CheckPrefix(%q): %v, want ErrInvalid", p, err)
		}
	}
}

func TestCheckValue(t *testing.T) {
	for _, v := range []string{`{}`, ` {"a":1}`, `{"a":{"b":[1,2]}}`} {
		if err := datastore.CheckValue("pools/x", []byte(v)); err != nil {
			t.Errorf("CheckValue(%s): %v", v, err)
		}
	}
	big := []byte(`{"v":"` + strings.Repeat("x", datastore.MaxValue) + `"}`)
	for _, v := range [][]byte{nil, []byte(`[]`), []byte(`"s"`), []byte(`{`), []byte(`{} {}`), big} {
		err := datastore.CheckValue("pools/x", v)
		if !errors.Is(err, datastore.ErrInvalid) || !strings.Contains(err.Error(), `"pools/x"`) {
			t.Errorf("CheckValue(%.20q): %v, want ErrInvalid naming the key", v, err)
		}
	}
}

func TestCheckNode(t *testing.T) {
	if err := datastore.CheckNode("node-1.example", "node-1/boot-abc", 15*time.Second); err != nil {
		t.Fatalf("CheckNode: %v", err)
	}
	cases := []struct {
		node, holder string
		ttl          time.Duration
		names        string
	}{
		{"", "h", time.Second, "node"},
		{"Node", "h", time.Second, "Node"},
		{"n", "", time.Second, "holder"},
		{"n", "a b", time.Second, "holder"},
		{"n", "h", 0, "ttl"},
		{"n", "h", 2500 * time.Millisecond, "ttl"},
	}
	for _, c := range cases {
		err := datastore.CheckNode(c.node, c.holder, c.ttl)
		if !errors.Is(err, datastore.ErrInvalid) || !strings.Contains(err.Error(), c.names) {
			t.Errorf("CheckNode(%q, %q, %v): %v, want ErrInvalid naming %s", c.node, c.holder, c.ttl, err, c.names)
		}
	}
}
