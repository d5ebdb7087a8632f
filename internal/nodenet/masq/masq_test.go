package masq_test

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/ipledger/ipledger/internal/nodenet/masq"
	"github.com/ipledger/ipledger/internal/testenv/netnodes"
)

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestSyncRemove(t *testing.T) {
	env := netnodes.New(t, 1)
	node := env.Node(0)
	conn, err := nftables.New(nftables.WithNetNSFd(int(node.Handle)))
	if err != nil {
		t.Fatal(err)
	}
	// Another owner's table (as kube-proxy's would be): never touched.
	other := conn.AddTable(&nftables.Table{Name: "other", Family: nftables.TableFamilyIPv4})
	conn.AddChain(&nftables.Chain{Name: "post", Table: other, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}

	m := masq.New(node.Handle)
	if _, err := m.Current(); !errors.Is(err, masq.ErrNoTable) {
		t.Fatalf("Current before Sync: %v, want ErrNoTable", err)
	}
	pods := prefixes("10.244.1.0/24", "10.244.0.0/24", "fd00:244::/64", "fd00:244:0:1::/64", "10.244.2.0/24")
	nonMasq := prefixes("192.168.0.0/16", "255.255.255.0/24", "fd99::/16")
	if err := m.Sync(pods, nonMasq); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	st, err := m.Current()
	if err != nil {
		t.Fatalf("Current: %v", err)
	}
	wantPods := prefixes("10.244.0.0/23", "10.244.2.0/24", "fd00:244::/63")
	if !slices.Equal(st.PodCIDRs, wantPods) || !slices.Equal(st.NonMasq, nonMasq) || st.Rules != 2 || st.Packets != 0 {
		t.Errorf("read back %+v, want pods %v non-masq %v, 2 rules, 0 packets", st, wantPods, nonMasq)
	}

	// The raw ruleset: one inet table, a nat chain at postrouting/srcnat, two
	// rules ending in masquerade, interval sets.
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	var tbl *nftables.Table
	for _, tb := range tables {
		if tb.Name == masq.TableName {
			tbl = tb
		}
	}
	if tbl == nil {
		t.Fatalf("no inet %s table among %v", masq.TableName, tables)
	}
	ch, err := conn.ListChain(tbl, masq.ChainName)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Type != nftables.ChainTypeNAT || ch.Hooknum == nil || *ch.Hooknum != *nftables.ChainHookPostrouting || ch.Priority == nil || *ch.Priority != *nftables.ChainPriorityNATSource {
		t.Errorf("chain %+v: want nat, postrouting, srcnat", ch)
	}
	rules, err := conn.GetRules(tbl, ch)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		var lookups, inverted int
		for _, e := range r.Exprs {
			if l, ok := e.(*expr.Lookup); ok {
				lookups++
				if l.Invert {
					inverted++
				}
			}
		}
		if _, ok := r.Exprs[len(r.Exprs)-1].(*expr.Masq); !ok || lookups != 3 || inverted != 2 {
			t.Errorf("rule %d: %d lookups (%d inverted), last %T", r.Handle, lookups, inverted, r.Exprs[len(r.Exprs)-1])
		}
	}
	sets, err := conn.GetSets(tbl)
	if err != nil {
		t.Fatal(err)
	}
	if len(sets) != 4 {
		t.Errorf("%d sets, want 4", len(sets))
	}
	for _, s := range sets {
		if !s.Interval {
			t.Errorf("set %s is not an interval set", s.Name)
		}
	}

	// A second Sync replaces the contents.
	if err := m.Sync(prefixes("10.96.0.0/16"), nil); err != nil {
		t.Fatalf("second Sync: %v", err)
	}
	st, err = m.Current()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.PodCIDRs, prefixes("10.96.0.0/16")) || st.NonMasq != nil || st.Rules != 2 {
		t.Errorf("after second Sync: %+v", st)
	}

	if err := m.Remove(); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if _, err := m.Current(); !errors.Is(err, masq.ErrNoTable) {
		t.Errorf("Current after Remove: %v, want ErrNoTable", err)
	}
	if err := m.Remove(); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	all, err := conn.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || all[0].Name != "other" {
		t.Errorf("tables after Remove: %v, want only the other owner's", all)
	}
}
