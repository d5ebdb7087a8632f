package masq

import (
	"bytes"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/ipledger/ipledger/internal/nsenter"
	"github.com/vishvananda/netns"
)

// The forwarding accepts.
//
// A node whose iptables FORWARD policy is DROP (Docker, ufw and firewalld leave it
// so) drops every packet it forwards unless a rule of that chain accepts it: pod to
// pod across nodes, pod to outside, and the replies. An accept in a table of
// ipledger's own cannot help: every base chain on the forward hook sees the
// packet, and a drop in any of them is final. So the accepts go where the DROP is,
// into the filter table's FORWARD chain. flannel and Calico run the iptables
// binaries for that; the agent's image holds none, so the agent writes, through
// nftables netlink, exactly the rules iptables-nft itself writes for
//
//	-N IPLEDGER-FWD
//	-A FORWARD -j IPLEDGER-FWD
//	-A IPLEDGER-FWD -s 10.244.0.0/16 -j ACCEPT
//	-A IPLEDGER-FWD -d 10.244.0.0/16 -j ACCEPT
//
// (payload, bitwise for a prefix not on a byte boundary, cmp, counter, verdict),
// into the tables "ip filter" and "ip6 filter" that iptables-nft keeps, so that
// `iptables -S`, iptables-save and iptables-restore (kube-proxy's iptables mode,
// Docker) read them as their own, and nothing of theirs is touched. The jump is
// appended, so an operator's DROP rules earlier in FORWARD still apply: the accepts
// stand in for the policy only (flannel's FLANNEL-FWD does the same). Where the
// table or its FORWARD chain does not exist, iptables-nft has no DROP to undo and
// nothing is written. kube-proxy's nftables mode keeps tables of its own and
// drops nothing forwarded. iptables-legacy (x_tables, not nftables) cannot be
// written without its binary: the agent reports a legacy filter table instead.
//
// Forwarding itself: net.ipv4.ip_forward off makes the node drop every packet it
// would forward from its uplink (ipledger-veth turns forwarding on per pod veth,
// which covers only what the pods send). The agent turns it on when it is off and
// a pod range is IPv4, as Calico's felix and Cilium do (kubeadm requires it, and
// kube-proxy assumes it); where /proc/sys is read-only (a DaemonSet that is not
// privileged, systemd's ProtectKernelTunables) it reports instead. IPv6
// forwarding (net.ipv6.conf.all.forwarding) is only reported: turning it on stops
// router advertisements being accepted on interfaces with accept_ra=1, which can
// take the node's own IPv6 default route away; that is the operator's choice.

// ForwardChain is the chain of the accepts in the filter tables.
const ForwardChain = "IPLEDGER-FWD"

// Forward keeps the forwarding accepts and checks forwarding in one network
// namespace. Its methods must not run concurrently with each other.
type Forward struct {
	ns   netns.NsHandle
	opts []nftables.ConnOption
}

// NewForward returns a Forward working in ns, or in the calling thread's
// namespace when ns is not open (netns.None()).
func NewForward(ns netns.NsHandle) *Forward {
	f := &Forward{ns: ns}
	if ns.IsOpen() {
		f.opts = append(f.opts, nftables.WithNetNSFd(int(ns)))
	}
	return f
}

// FamilyStatus is one family's forwarding, as the last Sync found and left it.
type FamilyStatus struct {
	// Ranges: the family has pod ranges (else nothing below matters).
	Ranges bool `json:"ranges"`
	// Filter: iptables-nft's filter table has a FORWARD chain here.
	Filter bool `json:"filter"`
	// Policy is that chain's policy (ACCEPT, DROP), "" without one.
	Policy string `json:"policy,omitempty"`
	// Accepts: ipledger's accepts are in that chain.
	Accepts bool `json:"accepts"`
	// Legacy: an iptables-legacy filter table is loaded, whose FORWARD policy
	// the agent cannot see.
	Legacy bool `json:"legacy,omitempty"`
	// Forwarding: the kernel forwards this family (after the agent turned IPv4 on
	// where it could).
	Forwarding bool `json:"forwarding"`
	// SetForwarding: the agent turned forwarding on.
	SetForwarding bool `json:"setForwarding,omitempty"`
	// Err is what kept the accepts or forwarding from being checked or written.
	Err string `json:"error,omitempty"`
}

// ForwardStatus is both families'.
type ForwardStatus struct {
	IPv4 FamilyStatus `json:"ipv4"`
	IPv6 FamilyStatus `json:"ipv6"`
}

// family is what differs between IPv4 and IPv6.
type family struct {
	v4       bool
	name     string
	nft      nftables.TableFamily
	saddr    uint32 // offsets in the network header
	daddr    uint32
	sysctl   string // under /proc/sys/net
	legacy   string // /proc/net file listing iptables-legacy's tables
	setSysOK bool   // the agent may turn forwarding on
}

var families = []family{
	{true, "IPv4", nftables.TableFamilyIPv4, 12, 16, "ipv4/ip_forward", "/proc/net/ip_tables_names", true},
	{false, "IPv6", nftables.TableFamilyIPv6, 8, 24, "ipv6/conf/all/forwarding", "/proc/net/ip6_tables_names", false},
}

// Sync puts the accepts of podCIDRs into FORWARD (removing them for a family
// without pod ranges) and checks forwarding. The status says what holds even when
// the error is not nil.
func (f *Forward) Sync(podCIDRs []netip.Prefix) (ForwardStatus, error) {
	var st ForwardStatus
	var errs []error
	for _, fam := range families {
		fs := &st.IPv4
		if !fam.v4 {
			fs = &st.IPv6
		}
		var want []netip.Prefix
		for _, p := range podCIDRs {
			if p.IsValid() && p.Addr().Is4() == fam.v4 && !p.Addr().Is4In6() {
				want = append(want, p.Masked())
			}
		}
		fs.Ranges = len(want) > 0
		if err := f.syncFamily(fam, want, fs); err != nil {
			fs.Err = err.Error()
			errs = append(errs, fmt.Errorf("%s: %w", fam.name, err))
		}
	}
	return st, errors.Join(errs...)
}

func (f *Forward) syncFamily(fam family, want []netip.Prefix, fs *FamilyStatus) error {
	var errs []error
	if fs.Ranges {
		on, set, err := f.forwarding(fam)
		fs.Forwarding, fs.SetForwarding = on, set
		if err != nil {
			errs = append(errs, err)
		}
		fs.Legacy = f.legacy(fam)
	}
	c, err := nftables.New(f.opts...)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("nftables: %w", err))...)
	}
	have, err := readForward(c, fam)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	fs.Filter, fs.Policy = have.forward != nil, have.policy
	if p := planForward(have, fam, want); !p.empty() {
		p.apply(c, have)
		if err := c.Flush(); err != nil {
			return errors.Join(append(errs, fmt.Errorf("nftables: writing %s to the filter table's FORWARD: %w", ForwardChain, err))...)
		}
	}
	fs.Accepts = fs.Ranges && fs.Filter
	return errors.Join(errs...)
}

// Remove deletes the accepts of both families; none is success (nothing written).
func (f *Forward) Remove() (bool, error) {
	var removed bool
	var errs []error
	c, err := nftables.New(f.opts...)
	if err != nil {
		return false, fmt.Errorf("nftables: %w", err)
	}
	for _, fam := range families {
		have, err := readForward(c, fam)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", fam.name, err))
			continue
		}
		p := planForward(have, fam, nil)
		if p.empty() {
			continue
		}
		p.apply(c, have)
		if err := c.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("%s: nftables: removing %s: %w", fam.name, ForwardChain, err))
			continue
		}
		removed = true
	}
	return removed, errors.Join(errs...)
}

// legacy reports whether iptables-legacy's filter table is loaded for fam.
func (f *Forward) legacy(fam family) bool {
	var found bool
	_ = inNS(f.ns, func() error {
		b, err := os.ReadFile(fam.legacy)
		found = err == nil && slices.Contains(strings.Fields(string(b)), "filter")
		return nil
	})
	return found
}

// acceptRule is one rule of the chain: accept from (src) or to a prefix.
type acceptRule struct {
	src bool
	p   netip.Prefix
}

func (r acceptRule) String() string {
	if r.src {
		return "-s " + r.p.String()
	}
	return "-d " + r.p.String()
}

// forwardState is one family's filter table as read.
type forwardState struct {
	table   *nftables.Table
	forward *nftables.Chain // the FORWARD base chain; nil: none
	policy  string
	chain   *nftables.Chain  // ForwardChain; nil: none
	rules   []acceptRule     // its rules; a rule of another form reads as invalid
	jumps   []*nftables.Rule // FORWARD's rules that jump to ForwardChain
}

// forwardPlan is one transaction on a family's filter table.
type forwardPlan struct {
	createChain bool
	flushChain  bool
	rules       []acceptRule // written after the flush
	addJump     bool
	delJumps    []*nftables.Rule
	delChain    bool
}

func (p forwardPlan) empty() bool {
	return !p.createChain && !p.flushChain && !p.addJump && len(p.delJumps) == 0 && !p.delChain
}

// desiredAccepts is the chain's rules for want, sorted, duplicates dropped.
func desiredAccepts(want []netip.Prefix) []acceptRule {
	want = slices.Clone(want)
	slices.SortFunc(want, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	want = slices.Compact(want)
	var out []acceptRule
	for _, p := range want {
		out = append(out, acceptRule{true, p}, acceptRule{false, p})
	}
	return out
}

// planForward: with want, the chain holding exactly its accepts and one jump to
// it; without, neither. Nothing at all without a FORWARD chain of iptables-nft.
func planForward(have forwardState, fam family, want []netip.Prefix) forwardPlan {
	var p forwardPlan
	if len(want) == 0 {
		p.delJumps = have.jumps
		p.delChain = have.chain != nil
		return p
	}
	if have.forward == nil {
		return p
	}
	rules := desiredAccepts(want)
	if have.chain == nil {
		p.createChain = true
		p.rules = rules
	} else if !slices.Equal(have.rules, rules) {
		p.flushChain = true
		p.rules = rules
	}
	if len(have.jumps) == 0 {
		p.addJump = true
	} else {
		p.delJumps = have.jumps[1:]
	}
	return p
}

// apply queues p on c.
func (p forwardPlan) apply(c *nftables.Conn, have forwardState) {
	fam := familyOf(have.table)
	for _, j := range p.delJumps {
		_ = c.DelRule(j) // fails only without a handle, which rules read back have
	}
	chain := have.chain
	if p.createChain {
		chain = c.AddChain(&nftables.Chain{Name: ForwardChain, Table: have.table})
	}
	if p.flushChain {
		c.FlushChain(chain)
	}
	for _, r := range p.rules {
		c.AddRule(&nftables.Rule{Table: have.table, Chain: chain, Exprs: acceptExprs(fam, r)})
	}
	if p.addJump {
		c.AddRule(&nftables.Rule{Table: have.table, Chain: have.forward, Exprs: []expr.Any{
			&expr.Counter{},
			&expr.Verdict{Kind: expr.VerdictJump, Chain: ForwardChain},
		}})
	}
	if p.delChain {
		c.FlushChain(chain)
		c.DelChain(chain)
	}
}

func familyOf(t *nftables.Table) family {
	if t != nil && t.Family == nftables.TableFamilyIPv6 {
		return families[1]
	}
	return families[0]
}

// acceptExprs is the rule iptables-nft writes for -s/-d PREFIX -j ACCEPT.
func acceptExprs(fam family, r acceptRule) []expr.Any {
	off := fam.daddr
	if r.src {
		off = fam.saddr
	}
	addr := r.p.Addr().AsSlice()
	n := uint32(r.p.Bits() / 8)
	var out []expr.Any
	if r.p.Bits()%8 == 0 {
		out = append(out,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr[:n]})
	} else {
		mask := make([]byte, len(addr))
		for i := range r.p.Bits() {
			mask[i/8] |= 0x80 >> (i % 8)
		}
		out = append(out,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: uint32(len(addr))},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(len(addr)), Mask: mask, Xor: make([]byte, len(addr))},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr})
	}
	return append(out, &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept})
}

// parseAccept reads a rule acceptExprs wrote; false for any other rule.
func parseAccept(fam family, exprs []expr.Any) (acceptRule, bool) {
	var r acceptRule
	if len(exprs) < 4 {
		return r, false
	}
	pl, ok := exprs[0].(*expr.Payload)
	if !ok || pl.Base != expr.PayloadBaseNetworkHeader || (pl.Offset != fam.saddr && pl.Offset != fam.daddr) {
		return r, false
	}
	r.src = pl.Offset == fam.saddr
	alen := 4
	if !fam.v4 {
		alen = 16
	}
	i := 1
	nbits := int(pl.Len) * 8
	if bw, ok := exprs[i].(*expr.Bitwise); ok {
		ones := 0
		for _, b := range bw.Mask {
			ones += bits.OnesCount8(b)
		}
		nbits = ones
		i++
	}
	if len(exprs) != i+3 {
		return r, false
	}
	cmp, ok := exprs[i].(*expr.Cmp)
	if !ok || cmp.Op != expr.CmpOpEq || len(cmp.Data) > alen {
		return r, false
	}
	if _, ok := exprs[i+1].(*expr.Counter); !ok {
		return r, false
	}
	if v, ok := exprs[i+2].(*expr.Verdict); !ok || v.Kind != expr.VerdictAccept {
		return r, false
	}
	full := make([]byte, alen)
	copy(full, cmp.Data)
	a, _ := netip.AddrFromSlice(full)
	p, err := a.Prefix(nbits)
	if err != nil || p.Addr() != a {
		return r, false
	}
	r.p = p
	return r, true
}

// readForward reads fam's iptables-nft filter table: its FORWARD chain, the jumps
// to ForwardChain, and that chain's rules.
func readForward(c *nftables.Conn, fam family) (forwardState, error) {
	var st forwardState
	chains, err := c.ListChainsOfTableFamily(fam.nft)
	if err != nil {
		return st, fmt.Errorf("nftables: chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table.Name != "filter" {
			continue
		}
		switch {
		case ch.Name == "FORWARD" && ch.Hooknum != nil && *ch.Hooknum == *nftables.ChainHookForward:
			st.forward, st.table = ch, ch.Table
			st.policy = "ACCEPT"
			if ch.Policy != nil && *ch.Policy == nftables.ChainPolicyDrop {
				st.policy = "DROP"
			}
		case ch.Name == ForwardChain:
			st.chain, st.table = ch, ch.Table
		}
	}
	if st.forward != nil {
		rules, err := c.GetRules(st.table, st.forward)
		if err != nil {
			return st, fmt.Errorf("nftables: rules of FORWARD: %w", err)
		}
		for _, r := range rules {
			for _, e := range r.Exprs {
				if v, ok := e.(*expr.Verdict); ok && v.Kind == expr.VerdictJump && v.Chain == ForwardChain {
					st.jumps = append(st.jumps, r)
				}
			}
		}
	}
	if st.chain != nil {
		rules, err := c.GetRules(st.table, st.chain)
		if err != nil {
			return st, fmt.Errorf("nftables: rules of %s: %w", ForwardChain, err)
		}
		for _, r := range rules {
			ar, _ := parseAccept(fam, r.Exprs)
			st.rules = append(st.rules, ar)
		}
	}
	return st, nil
}

// forwarding reads the family's forwarding switch and, for IPv4, turns it on when
// off: on, whether the agent set it, and why it could not.
func (f *Forward) forwarding(fam family) (on, set bool, err error) {
	path := filepath.Join("/proc/sys/net", fam.sysctl)
	err = inNS(f.ns, func() error {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		on = string(bytes.TrimSpace(b)) != "0"
		if on || !fam.setSysOK {
			return nil
		}
		if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("forwarding is off and cannot be turned on: %w", err)
		}
		on, set = true, true
		return nil
	})
	return on, set, err
}

// inNS runs fn on a thread inside ns (a child process it starts is born there),
// or on the calling goroutine when ns is not open. If the thread cannot return to
// its own namespace it stays locked, so Go retires it with the goroutine.
func inNS(ns netns.NsHandle, fn func() error) error {
	if !ns.IsOpen() {
		return fn()
	}
	return nsenter.Do(int(ns), fn)
}
