package main

import (
	"errors"
	"io"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/ipledger/ipledger/internal/nodenet/masq"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// TestMasqueradeOn: which flags keep the masquerade table; every other start
// removes it.
func TestMasqueradeOn(t *testing.T) {
	etcd := []string{"--datastore", "etcd", "--etcd-endpoints", "http://127.0.0.1:2379", "--node-ip", "10.0.0.11"}
	for _, tc := range []struct {
		args []string
		on   bool
	}{
		{nil, false}, // node-local: no --node-name
		{[]string{"--node-name", "a"}, true},
		{[]string{"--node-name", "a", "--masquerade=false"}, false},
		{[]string{"--node-name", "a", "--routes=false"}, true},
		{append([]string{"--node-name", "a"}, etcd...), true},
		{append([]string{"--node-name", "a", "--masquerade=false"}, etcd...), false},
		{[]string{"--node-name", "a", "--datastore", "kubernetes", "--masquerade=false"}, false},
	} {
		o, err := parse(tc.args, noEnv, io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got := masqueradeOn(o); got != tc.on {
			t.Errorf("%v: masquerade on %v, want %v", tc.args, got, tc.on)
		}
	}
}

// TestMasqueradeOffRemovesTable: an agent started without --node-name (node
// network and masquerade off) in a network namespace holding the table inet
// ipledger and the FORWARD accepts of an earlier run removes both before it serves.
func TestMasqueradeOffRemovesTable(t *testing.T) {
	name := netenv.Namespace(t, "ipl-masqoff-").Name
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	m := masq.New(h)
	if err := m.Sync([]netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, nil); err != nil {
		t.Fatal(err)
	}
	// the FORWARD accepts of the earlier run, in a FORWARD chain with policy DROP
	if out, err := exec.Command("ip", "netns", "exec", name, "iptables-nft", "-P", "FORWARD", "DROP").CombinedOutput(); err != nil {
		t.Fatalf("iptables-nft -P FORWARD DROP: %v\n%s", err, out)
	}
	if st, err := masq.NewForward(h).Sync([]netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}); err != nil || !st.IPv4.Accepts {
		t.Fatalf("forward accepts: %+v, %v", st, err)
	}
	a := agentenv.Start(t, agentenv.Options{Netns: name})
	if _, err := m.Current(); !errors.Is(err, masq.ErrNoTable) {
		t.Errorf("the agent serves, the table of the earlier run: %v; want it removed", err)
	}
	out, err := exec.Command("ip", "netns", "exec", name, "iptables-nft", "-S").CombinedOutput()
	if err != nil || strings.Contains(string(out), masq.ForwardChain) || !strings.Contains(string(out), "-P FORWARD DROP") {
		t.Errorf("the agent serves, iptables -S (%v):\n%s\nwant the accepts of the earlier run gone, the policy kept", err, out)
	}
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
}
