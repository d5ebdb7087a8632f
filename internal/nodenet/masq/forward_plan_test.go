package masq

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"
)

func TestAcceptExprsRoundTrip(t *testing.T) {
	for _, s := range []string{"10.244.0.0/16", "10.244.0.0/26", "10.244.0.5/32", "fd00:244::/56", "fd00:244::/122", "fd00::1/128"} {
		p := netip.MustParsePrefix(s)
		fam := families[0]
		if p.Addr().Is6() {
			fam = families[1]
		}
		for _, src := range []bool{true, false} {
			r := acceptRule{src, p}
			got, ok := parseAccept(fam, acceptExprs(fam, r))
			if !ok || got != r {
				t.Errorf("%v: read back %v %v", r, got, ok)
			}
		}
	}
}

func TestPlanForward(t *testing.T) {
	fam := families[0]
	tbl := &nftables.Table{Name: "filter", Family: nftables.TableFamilyIPv4}
	fwd := &nftables.Chain{Name: "FORWARD", Table: tbl}
	ours := &nftables.Chain{Name: ForwardChain, Table: tbl}
	pods := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	jump := &nftables.Rule{Handle: 7}

	if p := planForward(forwardState{}, fam, pods); !p.empty() {
		t.Errorf("no iptables-nft FORWARD chain: plan %+v, want nothing (no DROP of iptables-nft to undo)", p)
	}
	p := planForward(forwardState{table: tbl, forward: fwd, policy: "DROP"}, fam, pods)
	if !p.createChain || !p.addJump || len(p.rules) != 2 || p.flushChain {
		t.Errorf("FORWARD without ours: plan %+v, want the chain, its two accepts and the jump", p)
	}
	done := forwardState{table: tbl, forward: fwd, chain: ours, rules: desiredAccepts(pods), jumps: []*nftables.Rule{jump}}
	if p := planForward(done, fam, pods); !p.empty() {
		t.Errorf("in place: plan %+v, want nothing", p)
	}
	changed := planForward(done, fam, append(pods, netip.MustParsePrefix("10.96.0.0/24")))
	if !changed.flushChain || len(changed.rules) != 4 || changed.addJump || changed.createChain {
		t.Errorf("a range added: plan %+v, want the chain rewritten, the jump kept", changed)
	}
	twice := done
	twice.jumps = []*nftables.Rule{jump, {Handle: 9}}
	if p := planForward(twice, fam, pods); len(p.delJumps) != 1 || p.delJumps[0].Handle != 9 || p.addJump {
		t.Errorf("two jumps: plan %+v, want the second deleted", p)
	}
	foreign := done
	foreign.rules = []acceptRule{{}} // a rule of another form in our chain
	if p := planForward(foreign, fam, pods); !p.flushChain {
		t.Errorf("a foreign rule in %s: plan %+v, want the chain rewritten", ForwardChain, p)
	}
	off := planForward(done, fam, nil)
	if !off.delChain || !slices.Equal(off.delJumps, done.jumps) || off.addJump {
		t.Errorf("no pod range: plan %+v, want the jump and the chain deleted", off)
	}
	if p := planForward(forwardState{}, fam, nil); !p.empty() {
		t.Errorf("nothing there, nothing wanted: plan %+v", p)
	}
}
