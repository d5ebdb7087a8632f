// Package masq masquerades pod traffic that leaves the cluster's pod ranges:
// a packet from a pod range to a destination outside every pod range and
// outside the non-masquerade CIDRs leaves with the address of its outgoing
// interface (the node's address) as source, so the network outside needs no
// route back to pod addresses. Traffic between pods, on one node or across
// nodes, keeps its pod source address.
//
// The rules are nftables, written through netlink with github.com/google/nftables
// (pure Go): the agent's container image holds no iptables or nft binary. They
// live in a table of ipledger's own, "inet ipledger", which nothing else
// writes: kube-proxy's rules (iptables-nft, or its nftables mode) live in
// tables of their own, so both coexist, and Remove deletes ipledger's table and
// nothing else. Within the table:
//
//	set pods4, pods6       (interval) the cluster's pod ranges
//	set nomasq4, nomasq6   (interval) the non-masquerade CIDRs
//	chain postrouting      nat hook postrouting, priority srcnat (100)
//	  ip  saddr @pods4 ip  daddr != @pods4 ip  daddr != @nomasq4 counter masquerade random-fully
//	  ip6 saddr @pods6 ip6 daddr != @pods6 ip6 daddr != @nomasq6 counter masquerade random-fully
//
// random-fully picks the source port at random (as kube-proxy's and Calico's
// masquerade do): sequential port choice races between two connections masqueraded
// at once to one destination and drops one's first packet.
//
// Sync plans, then applies: it reads the table back, compares it with the desired
// one, and writes only the difference in one nftables transaction (a packet, and a
// reader of the ruleset, sees the old state or the new one, never half of it). A
// change of pod ranges adds and deletes set elements in place; the chain and its
// rules (and their counters) stay. Only a table that is missing, or whose chain or
// rules are not exactly this release's (each rule carries a comment naming its
// form), is built anew. A sync of an unchanged world sends nothing.
package masq

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Names in the ruleset.
const (
	TableName = "ipledger"
	ChainName = "postrouting"

	setPods4   = "pods4"
	setPods6   = "pods6"
	setNoMasq4 = "nomasq4"
	setNoMasq6 = "nomasq6"
)

// Masq keeps ipledger's masquerade table in one network namespace. Its methods
// must not run concurrently with each other.
type Masq struct {
	opts   []nftables.ConnOption
	writes atomic.Uint64
}

// New returns a Masq working in the network namespace ns, or in the calling
// thread's namespace when ns is not open (netns.None()). The handle must stay
// open while the Masq is used.
func New(ns netns.NsHandle) *Masq {
	m := &Masq{}
	if ns.IsOpen() {
		m.opts = append(m.opts, nftables.WithNetNSFd(int(ns)))
	}
	return m
}

func (m *Masq) conn() (*nftables.Conn, error) {
	c, err := nftables.New(m.opts...)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return c, nil
}

func table() *nftables.Table {
	return &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
}

// Sync makes the table masquerade traffic from podCIDRs to anything outside
// podCIDRs and nonMasq. Prefixes of both families may be mixed; overlapping
// and adjacent ones are merged. It writes only what differs from the table in
// the kernel, in one transaction, and nothing when nothing differs.
func (m *Masq) Sync(podCIDRs, nonMasq []netip.Prefix) error {
	c, err := m.conn()
	if err != nil {
		return err
	}
	have, err := m.read(c)
	if err != nil {
		return err
	}
	p := planSync(have, desiredSets(podCIDRs, nonMasq))
	if p.empty() {
		return nil
	}
	if p.rebuild {
		m.build(c, p.want)
	} else {
		t := table()
		for _, name := range setNames {
			set := &nftables.Set{Table: t, Name: name, Interval: true, KeyType: keyType(name)}
			if d := elements(p.del[name]); len(d) > 0 {
				if err := c.SetDeleteElements(set, d); err != nil {
					return fmt.Errorf("nftables set %s: %w", name, err)
				}
			}
			if a := elements(p.add[name]); len(a) > 0 {
				if err := c.SetAddElements(set, a); err != nil {
					return fmt.Errorf("nftables set %s: %w", name, err)
				}
			}
		}
	}
	m.writes.Add(1)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: write table inet %s: %w", TableName, err)
	}
	return nil
}

// Writes is the number of transactions Sync has sent (Remove's not counted).
func (m *Masq) Writes() uint64 { return m.writes.Load() }

// setNames are the table's sets, in the order they are written.
var setNames = []string{setPods4, setPods6, setNoMasq4, setNoMasq6}

func isV4Set(name string) bool { return name == setPods4 || name == setNoMasq4 }

func keyType(name string) nftables.SetDatatype {
	if isV4Set(name) {
		return nftables.TypeIPAddr
	}
	return nftables.TypeIP6Addr
}

// ruleTags are the comments of the chain's rules, in order: a rule read back with
// another comment (or none: an older release's) is not this release's rule.
var ruleTags = []string{"ipledger masquerade ipv4 random-fully", "ipledger masquerade ipv6 random-fully"}

// desiredSets is each set's merged ranges.
func desiredSets(podCIDRs, nonMasq []netip.Prefix) map[string][]ipRange {
	return map[string][]ipRange{
		setPods4:   mergeRanges(podCIDRs, true),
		setPods6:   mergeRanges(podCIDRs, false),
		setNoMasq4: mergeRanges(nonMasq, true),
		setNoMasq6: mergeRanges(nonMasq, false),
	}
}

// tableState is the table as read from the kernel.
type tableState struct {
	table bool
	// rulesOK: the chain exists, is the nat postrouting chain at srcnat, and its
	// rules carry ruleTags in order.
	rulesOK bool
	// sets: each set's ranges; a set that is missing has no entry.
	sets map[string][]ipRange
}

// syncPlan is what Sync writes: the whole table (rebuild), or elements to delete
// from and add to each set, in one transaction.
type syncPlan struct {
	rebuild  bool
	want     map[string][]ipRange
	del, add map[string][]ipRange
}

func (p syncPlan) empty() bool {
	if p.rebuild {
		return false
	}
	for _, name := range setNames {
		if len(p.del[name]) > 0 || len(p.add[name]) > 0 {
			return false
		}
	}
	return true
}

// planSync compares the table read back with the desired sets.
func planSync(have tableState, want map[string][]ipRange) syncPlan {
	p := syncPlan{want: want, del: map[string][]ipRange{}, add: map[string][]ipRange{}}
	if !have.table || !have.rulesOK {
		p.rebuild = true
		return p
	}
	for _, name := range setNames {
		cur, ok := have.sets[name]
		if !ok {
			p.rebuild = true
			return p
		}
		for _, r := range cur {
			if !slices.Contains(want[name], r) {
				p.del[name] = append(p.del[name], r)
			}
		}
		for _, r := range want[name] {
			if !slices.Contains(cur, r) {
				p.add[name] = append(p.add[name], r)
			}
		}
	}
	return p
}

// read reads the table's state; a missing table is no error.
func (m *Masq) read(c *nftables.Conn) (tableState, error) {
	st := tableState{sets: map[string][]ipRange{}}
	t, err := findTable(c)
	if err != nil || t == nil {
		return st, err
	}
	st.table = true
	sets, err := c.GetSets(t)
	if err != nil {
		return st, fmt.Errorf("nftables: sets of inet %s: %w", TableName, err)
	}
	for _, set := range sets {
		if !slices.Contains(setNames, set.Name) {
			continue
		}
		if !set.Interval || set.KeyType.Name != keyType(set.Name).Name {
			continue // not the form this release writes: rebuilt
		}
		elems, err := c.GetSetElements(set)
		if err != nil {
			return st, fmt.Errorf("nftables: elements of %s: %w", set.Name, err)
		}
		st.sets[set.Name] = rangesOf(elems, isV4Set(set.Name))
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return st, fmt.Errorf("nftables: chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table.Name != TableName || ch.Name != ChainName {
			continue
		}
		if ch.Type != nftables.ChainTypeNAT || ch.Hooknum == nil || *ch.Hooknum != *nftables.ChainHookPostrouting ||
			ch.Priority == nil || *ch.Priority != *nftables.ChainPriorityNATSource {
			return st, nil
		}
		rules, err := c.GetRules(t, ch)
		if err != nil {
			return st, fmt.Errorf("nftables: rules of %s: %w", ChainName, err)
		}
		var tags []string
		for _, r := range rules {
			tag, _ := userdata.GetString(r.UserData, userdata.TypeComment)
			tags = append(tags, tag)
		}
		st.rulesOK = slices.Equal(tags, ruleTags)
	}
	return st, nil
}

// findTable is ipledger's table, nil when there is none.
func findTable(c *nftables.Conn) (*nftables.Table, error) {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("nftables: list tables: %w", err)
	}
	for _, tb := range tables {
		if tb.Name == TableName {
			return tb, nil
		}
	}
	return nil, nil
}

// build queues the whole table, replacing any table of that name.
func (m *Masq) build(c *nftables.Conn, want map[string][]ipRange) {
	t := table()
	// Adding before deleting makes the delete succeed whether or not the
	// table exists; the batch is one transaction, so the table is never seen
	// missing or half-built.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)

	sets := map[string]*nftables.Set{}
	for i, name := range setNames {
		set := &nftables.Set{Table: t, Name: name, ID: uint32(i + 1), Interval: true, KeyType: keyType(name)}
		// AddSet fails only on a set without a name or key type
		_ = c.AddSet(set, elements(want[name]))
		sets[name] = set
	}

	accept := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{
		Name:     ChainName,
		Table:    t,
		Type:     nftables.ChainTypeNAT,
		Hooknum:  nftables.ChainHookPostrouting,
		Priority: nftables.ChainPriorityNATSource,
		Policy:   &accept,
	})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, UserData: userdata.AppendString(nil, userdata.TypeComment, ruleTags[0]),
		Exprs: masqRule(unix.NFPROTO_IPV4, 12, 16, 4, sets[setPods4], sets[setNoMasq4])})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, UserData: userdata.AppendString(nil, userdata.TypeComment, ruleTags[1]),
		Exprs: masqRule(unix.NFPROTO_IPV6, 8, 24, 16, sets[setPods6], sets[setNoMasq6])})
}

// masqRule: nfproto is proto, the source (network header offset saddr, length
// n) is in pods, the destination (offset daddr) neither in pods nor in nomasq:
// count, masquerade with a fully random source port.
func masqRule(proto byte, saddr, daddr, n uint32, pods, nomasq *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: saddr, Len: n},
		&expr.Lookup{SourceRegister: 1, SetName: pods.Name, SetID: pods.ID},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: daddr, Len: n},
		&expr.Lookup{SourceRegister: 1, SetName: pods.Name, SetID: pods.ID, Invert: true},
		&expr.Lookup{SourceRegister: 1, SetName: nomasq.Name, SetID: nomasq.ID, Invert: true},
		&expr.Counter{},
		&expr.Masq{FullyRandom: true},
	}
}

// Remove deletes ipledger's table; no table is success, and then nothing is
// written.
func (m *Masq) Remove() error {
	_, err := m.RemoveIfPresent()
	return err
}

// RemoveIfPresent deletes ipledger's table and reports whether there was one.
func (m *Masq) RemoveIfPresent() (bool, error) {
	c, err := m.conn()
	if err != nil {
		return false, err
	}
	found, err := findTable(c)
	if err != nil || found == nil {
		return false, err
	}
	t := table()
	c.AddTable(t)
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return false, fmt.Errorf("nftables: delete table inet %s: %w", TableName, err)
	}
	return true, nil
}

// State is the masquerade table as read back from the kernel.
type State struct {
	// PodCIDRs and NonMasq are the sets' contents, both families, as the
	// fewest prefixes covering them (merged ranges may read back as several).
	PodCIDRs, NonMasq []netip.Prefix
	// Rules is the number of rules in the postrouting chain (2 when whole).
	Rules int
	// Packets is what the masquerade rules' counters hold.
	Packets uint64
}

// Current reads the table back; ErrNoTable when it is absent.
func (m *Masq) Current() (State, error) {
	var st State
	c, err := m.conn()
	if err != nil {
		return st, err
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return st, fmt.Errorf("nftables: list tables: %w", err)
	}
	var t *nftables.Table
	for _, tb := range tables {
		if tb.Name == TableName {
			t = tb
		}
	}
	if t == nil {
		return st, ErrNoTable
	}
	for _, s := range []struct {
		name string
		v4   bool
		into *[]netip.Prefix
	}{
		{setPods4, true, &st.PodCIDRs},
		{setPods6, false, &st.PodCIDRs},
		{setNoMasq4, true, &st.NonMasq},
		{setNoMasq6, false, &st.NonMasq},
	} {
		set, err := c.GetSetByName(t, s.name)
		if err != nil {
			return st, fmt.Errorf("nftables: set %s: %w", s.name, err)
		}
		elems, err := c.GetSetElements(set)
		if err != nil {
			return st, fmt.Errorf("nftables: elements of %s: %w", s.name, err)
		}
		for _, r := range rangesOf(elems, s.v4) {
			*s.into = append(*s.into, r.prefixes()...)
		}
	}
	rules, err := c.GetRules(t, &nftables.Chain{Name: ChainName, Table: t})
	if err != nil {
		return st, fmt.Errorf("nftables: rules of %s: %w", ChainName, err)
	}
	st.Rules = len(rules)
	for _, r := range rules {
		for _, e := range r.Exprs {
			if ctr, ok := e.(*expr.Counter); ok {
				st.Packets += ctr.Packets
			}
		}
	}
	return st, nil
}

// ipRange is the addresses from..to, both included.
type ipRange struct{ from, to netip.Addr }

// mergeRanges is the prefixes of one family as sorted ranges, overlapping and
// adjacent ones merged: an interval set takes no two intervals that touch.
func mergeRanges(ps []netip.Prefix, v4 bool) []ipRange {
	var rs []ipRange
	for _, p := range ps {
		p = p.Masked() // invalid stays invalid, a zone goes
		if !p.IsValid() || p.Addr().Is4In6() || p.Addr().Is4() != v4 {
			continue
		}
		rs = append(rs, ipRange{p.Addr(), lastAddr(p)})
	}
	slices.SortFunc(rs, func(a, b ipRange) int { return cmp.Or(a.from.Compare(b.from), a.to.Compare(b.to)) })
	var out []ipRange
	for _, r := range rs {
		if n := len(out); n > 0 {
			last := &out[n-1]
			next := last.to.Next()
			if !next.IsValid() || r.from.Compare(next) <= 0 {
				if r.to.Compare(last.to) > 0 {
					last.to = r.to
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// elements encodes ranges for an interval set: a start key, and an interval
// end key one past the last address, left out when the range reaches the top
// of the address space.
func elements(rs []ipRange) []nftables.SetElement {
	var out []nftables.SetElement
	for _, r := range rs {
		out = append(out, nftables.SetElement{Key: r.from.AsSlice()})
		if end := r.to.Next(); end.IsValid() {
			out = append(out, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

// rangesOf decodes an interval set's elements of one family.
func rangesOf(elems []nftables.SetElement, v4 bool) []ipRange {
	type key struct {
		a   netip.Addr
		end bool
	}
	var keys []key
	for _, e := range elems {
		a, ok := netip.AddrFromSlice(e.Key)
		if !ok || a.Is4() != v4 {
			continue
		}
		keys = append(keys, key{a, e.IntervalEnd})
	}
	slices.SortFunc(keys, func(x, y key) int { return x.a.Compare(y.a) })
	var out []ipRange
	for i := 0; i < len(keys); i++ {
		if keys[i].end {
			continue // an end without start (nft's sentinel at address zero)
		}
		r := ipRange{from: keys[i].a, to: maxAddr(v4)}
		if i+1 < len(keys) && keys[i+1].end {
			r.to = keys[i+1].a.Prev()
			i++
		}
		out = append(out, r)
	}
	return out
}

// prefixes is the fewest prefixes covering r exactly.
func (r ipRange) prefixes() []netip.Prefix {
	var out []netip.Prefix
	from := r.from
	for from.IsValid() && from.Compare(r.to) <= 0 {
		var p netip.Prefix
		for bits := 0; bits <= from.BitLen(); bits++ {
			p = netip.PrefixFrom(from, bits)
			if p.Masked().Addr() == from && lastAddr(p).Compare(r.to) <= 0 {
				break
			}
		}
		out = append(out, p)
		from = lastAddr(p).Next()
	}
	return out
}

// lastAddr is the last address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func maxAddr(v4 bool) netip.Addr {
	if v4 {
		return netip.AddrFrom4([4]byte{255, 255, 255, 255})
	}
	var b [16]byte
	for i := range b {
		b[i] = 0xff
	}
	return netip.AddrFrom16(b)
}
