package masq

import (
	"net/netip"
	"testing"
)

func rangesOfPrefixes(v4 bool, ss ...string) []ipRange {
	var ps []netip.Prefix
	for _, s := range ss {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return mergeRanges(ps, v4)
}

func fullState(sets map[string][]ipRange) tableState {
	st := tableState{table: true, rulesOK: true, sets: map[string][]ipRange{}}
	for _, n := range setNames {
		st.sets[n] = sets[n]
	}
	return st
}

func TestPlanSync(t *testing.T) {
	want := desiredSets([]netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/56")},
		[]netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")})

	if p := planSync(fullState(want), want); !p.empty() {
		t.Errorf("unchanged world: plan %+v, want nothing", p)
	}
	if p := planSync(tableState{}, want); !p.rebuild {
		t.Errorf("no table: plan %+v, want a rebuild", p)
	}
	old := fullState(want)
	old.rulesOK = false // an older release's rules (no random-fully, no comment)
	if p := planSync(old, want); !p.rebuild {
		t.Errorf("foreign rules: plan %+v, want a rebuild", p)
	}
	missing := fullState(want)
	delete(missing.sets, setNoMasq6)
	if p := planSync(missing, want); !p.rebuild {
		t.Errorf("a set missing: plan %+v, want a rebuild", p)
	}

	// a pool range added, another gone: only those elements, in place
	have := fullState(desiredSets([]netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.96.0.0/24"),
		netip.MustParsePrefix("fd00:244::/56")}, []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}))
	want2 := desiredSets([]netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.245.0.0/16"),
		netip.MustParsePrefix("fd00:244::/56")}, []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")})
	p := planSync(have, want2)
	if p.rebuild || p.empty() {
		t.Fatalf("plan %+v: want an in-place change", p)
	}
	// 10.244/16 and 10.245/16 merge into one range: the old 10.244/16 goes too
	wantDel, wantAdd := rangesOfPrefixes(true, "10.96.0.0/24", "10.244.0.0/16"), rangesOfPrefixes(true, "10.244.0.0/15")
	if !equalRanges(p.del[setPods4], wantDel) || !equalRanges(p.add[setPods4], wantAdd) {
		t.Errorf("pods4: delete %v add %v, want delete %v add %v", p.del[setPods4], p.add[setPods4], wantDel, wantAdd)
	}
	for _, n := range []string{setPods6, setNoMasq4, setNoMasq6} {
		if len(p.del[n])+len(p.add[n]) != 0 {
			t.Errorf("set %s changed: delete %v add %v", n, p.del[n], p.add[n])
		}
	}
}

func equalRanges(a, b []ipRange) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
