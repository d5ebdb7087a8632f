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

// TestSyncInPlace: a sync of an unchanged world sends nothing; a change of pod
// ranges rewrites set elements only, so the rules (and their counters)
// stay and keep counting; a table of an older form is rebuilt; masquerade is random-fully.
func TestSyncInPlace(t *testing.T) {
	env := netnodes.New(t, 1)
	node := env.Node(0)
	conn, err := nftables.New(nftables.WithNetNSFd(int(node.Handle)))
	if err != nil {
		t.Fatal(err)
	}
	handles := func() {
		t.Helper()
		tbl := &nftables.Table{Name: masq.TableName, Family: nftables.TableFamilyINet}
		rules, err := conn.GetRules(tbl, &nftables.Chain{Name: masq.ChainName, Table: tbl})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rules {
			if m, ok := r.Exprs[len(r.Exprs)-1].(*expr.Masq); !ok || !m.FullyRandom {
				t.Errorf("rule %d ends in %#v, want masquerade random-fully", r.Handle, r.Exprs[len(r.Exprs)-1])
			}
		}
	}

	m := masq.New(node.Handle)
	pods := prefixes("10.244.0.0/16", "10.96.0.0/24", "fd00:244::/56")
	nonMasq := prefixes("192.168.0.0/16")
	if err := m.Sync(pods, nonMasq); err != nil {
		t.Fatal(err)
	}
	if m.Writes() != 1 {
		t.Fatalf("first sync: %d transactions, want 1", m.Writes())
	}
	handles()
	// one connection masqueraded: the IPv4 rule's counter moves
	pod := env.AddPod(node, "a", netip.MustParseAddr("10.244.0.5"))
	netnodes.ServeSource(t, env.Outside.NS, ":7000")
	if src, err := pod.SourceSeen(netip.AddrPortFrom(netnodes.OutsideV4, 7000)); err != nil || src != node.Addr4 {
		t.Fatalf("pod to outside: source %v, %v; want the node's %v", src, err, node.Addr4)
	}
	st, err := m.Current()
	if err != nil || st.Packets == 0 {
		t.Fatalf("after a masqueraded connection: %+v, %v; want packets counted", st, err)
	}
	counted := st.Packets
	if err := m.Sync(pods, nonMasq); err != nil {
		t.Fatal(err)
	}
	if m.Writes() != 1 {
		t.Errorf("second sync of an unchanged world: %d transactions in all, want still 1", m.Writes())
	}

	// a range gone, one added that merges with an existing one, an IPv6 one added
	pods2 := prefixes("10.244.0.0/16", "10.245.0.0/16", "fd00:244::/56", "fd00:245::/56")
	if err := m.Sync(pods2, nonMasq); err != nil {
		t.Fatal(err)
	}
	st, err = m.Current()
	if err != nil {
		t.Fatal(err)
	}
	if want := prefixes("10.244.0.0/15", "fd00:244::/56", "fd00:245::/56"); !slices.Equal(st.PodCIDRs, want) || !slices.Equal(st.NonMasq, nonMasq) {
		t.Errorf("after the change: %+v, want pods %v", st, want)
	}
	if m.Writes() != 2 {
		t.Errorf("%d transactions after the change, want 2", m.Writes())
	}
	if st.Packets < counted {
		t.Errorf("%d packets counted after the change, want the %d before kept (the rules changed in place, not rebuilt)", st.Packets, counted)
	}
	handles()

	// a table of an older release: same name, rules without the comment
	if err := m.Remove(); err != nil {
		t.Fatal(err)
	}
	tbl := conn.AddTable(&nftables.Table{Name: masq.TableName, Family: nftables.TableFamilyINet})
	ch := conn.AddChain(&nftables.Chain{Name: masq.ChainName, Table: tbl, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	conn.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{&expr.Counter{}, &expr.Masq{}}})
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := m.Sync(pods2, nonMasq); err != nil {
		t.Fatal(err)
	}
	if st, err := m.Current(); err != nil || st.Rules != 2 || len(st.PodCIDRs) != 3 {
		t.Errorf("older table rebuilt: %+v, %v", st, err)
	}
	handles()
}
