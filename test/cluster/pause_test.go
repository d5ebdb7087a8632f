package cluster_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
)

// smallPool has exactly two /26 blocks, so the two agents of the pause test contend
// for them.
const smallPool = `[[{"subnet":"10.79.0.0/25"}]]`

func addIn(t *testing.T, n *node, cid string) (netip.Addr, *api.Error) {
	t.Helper()
	resp, err := call(n, api.Request{Op: api.OpAdd, Network: network, ContainerID: cid, IfName: "eth0", Ranges: ledgertest.Ranges(t, smallPool)})
	if err != nil {
		if ae, ok := err.(*api.Error); ok {
			return netip.Addr{}, ae
		}
		t.Fatalf("%s: ADD %s: %v", n.name, cid, err)
	}
	return netip.MustParsePrefix(resp.Lease.IPs[0]).Addr(), nil
}

func leaseSet(t *testing.T, n *node) []string {
	t.Helper()
	var out []string
	for _, l := range n.Leases(t) {
		out = append(out, l.ContainerID+"="+strings.Join(l.IPs, ","))
	}
	slices.Sort(out)
	return out
}

func blockNamed(bs []api.BlockView, cidr string) (api.BlockView, bool) {
	for _, b := range bs {
		if b.Block == cidr && b.State != api.BlockLost {
			return b, true
		}
	}
	return api.BlockView{}, false
}

// TestPausedAgentFenced: an agent SIGSTOPped past its lease (3s TTL, 3s quarantine)
// keeps its block until its lease has stayed expired for the quarantine; meanwhile
// the other node, its own block full, gets no address from the paused node's block
// (strict affinity). Then the block is reclaimed (epoch bumped) and the other node
// allocates in it, the very addresses the paused node's leases hold. After SIGCONT
// the paused agent flags those leases lost, allocates nothing from the block, the
// cluster audit reports the overlap (exit 1) with the lost leases flagged, and its
// DELs release them locally only: the new owner's leases and block record are
// untouched and the audit balances again.
func TestPausedAgentFenced(t *testing.T) {
	sideBySideWhenShort(t)
	ec := etcdenv.StartCluster(t, 1)
	nodes := startNodes(t, 2, []string{"--datastore", "etcd", "--etcd-endpoints", strings.Join(ec.Endpoints(), ",")})
	a, b := nodes[0], nodes[1]
	var paused []netip.Addr
	for i := range 3 {
		ip, e := addIn(t, a, fmt.Sprint("a", i))
		if e != nil {
			t.Fatalf("ADD a%d: %v", i, e)
		}
		paused = append(paused, ip)
	}
	if _, e := addIn(t, b, "b0"); e != nil {
		t.Fatalf("ADD b0: %v", e)
	}
	bs := blocksOf(t, b)
	ownA, ownB := ownedBy(bs, a.name), ownedBy(bs, b.name)
	if len(ownA) != 1 || len(ownB) != 1 {
		t.Fatalf("want one block each: %+v", bs)
	}
	blockA := ownA[0]
	t.Logf("%s owns %s at epoch %d, holding %v; %s owns %s", a.name, blockA.Block, blockA.Epoch, paused, b.name, ownB[0].Block)

	pid := a.PID()
	stopped := time.Now()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume) // before agentenv's SIGTERM, which a stopped process would not act on

	// b fills its own block; the paused node's block is not lent to it
	for i := 1; ; i++ {
		ip, e := addIn(t, b, fmt.Sprint("b", i))
		if e != nil {
			if e.Code != api.CodeExhausted {
				t.Fatalf("ADD on a full node while the other block is owned: %v, want %q", e, api.CodeExhausted)
			}
			break
		}
		if p := netip.MustParsePrefix(blockA.Block); p.Contains(ip) {
			t.Fatalf("%s got %s from %s's block %s while %s is only paused (%v)", b.name, ip, a.name, blockA.Block, a.name, time.Since(stopped))
		}
	}
	if cur, _ := blockNamed(blocksOf(t, b), blockA.Block); cur.Owner != a.name {
		t.Fatalf("the block moved before the full node's ADD was refused: %+v", cur)
	}

	// the reclaim: only after the lease stayed expired for the quarantine
	var reclaimed time.Duration
	for {
		cur, ok := blockNamed(blocksOf(t, b), blockA.Block)
		if ok && cur.Owner != a.name {
			reclaimed = time.Since(stopped)
			if cur.Epoch <= blockA.Epoch {
				t.Fatalf("block %s changed owner to %q without an epoch bump (%d -> %d)", cur.Block, cur.Owner, blockA.Epoch, cur.Epoch)
			}
			break
		}
		if time.Since(stopped) > 60*time.Second {
			t.Fatalf("block %s not reclaimed 60s after %s was paused", blockA.Block, a.name)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%s's block reclaimed %v after SIGSTOP (lease TTL 3s + quarantine 3s)", a.name, reclaimed.Round(10*time.Millisecond))
	if reclaimed < 3*time.Second {
		t.Fatalf("block reclaimed %v after the pause, before the 3s quarantine could have passed", reclaimed)
	}

	// the other node claims it and hands out the paused node's addresses
	var taken []netip.Addr
	for i := range len(paused) {
		ip, e := addIn(t, b, fmt.Sprint("b-new", i))
		if e != nil {
			t.Fatalf("ADD on %s after the reclaim: %v", b.name, e)
		}
		taken = append(taken, ip)
	}
	t.Logf("%s now holds %v in the reclaimed block", b.name, taken)
	bBefore := leaseSet(t, b)
	blockNow, _ := blockNamed(blocksOf(t, b), blockA.Block)

	resume()
	// a renews, finds the block's epoch moved, and flags its leases there lost
	waitLost(t, a, len(paused))
	if out, _, _ := agentenv.Ctl(t, "--socket", a.Socket, "leases"); strings.Count(out, "(block "+blockA.Block+" lost)") != len(paused) {
		t.Errorf("ipledgerctl leases does not mark the %d leases in the lost block:\n%s", len(paused), out)
	}
	// it allocates nothing from the lost block (nor anywhere: both blocks are b's)
	if ip, e := addIn(t, a, "a-after"); e == nil {
		t.Fatalf("%s allocated %s after losing its block; every block is %s's", a.name, ip, b.name)
	} else if e.Code != api.CodeExhausted && e.Code != api.CodeUnavailable {
		t.Fatalf("ADD on the resumed node: %v", e)
	}
	// the audit sees the overlap, every double involving a lease flagged lost
	rep := clusterAudit(t, nodes)
	if rep.OK || rep.Lost != len(paused) || rep.DoubleAssigned != len(paused) || len(rep.Problems) != len(paused) {
		t.Fatalf("audit with the paused node's lost leases: ok=%v lost=%d doubles=%d problems %v; want the %d overlaps only", rep.OK, rep.Lost, rep.DoubleAssigned, rep.Problems, len(paused))
	}
	for _, d := range rep.Doubles {
		lost := false
		for _, h := range d.Holders {
			lost = lost || (h.Node == a.name && h.Lost)
		}
		if !lost {
			t.Errorf("%s held twice without a lost lease among its holders: %+v", d.IP, d.Holders)
		}
	}
	// its DELs release locally only
	for i := range paused {
		resp, err := a.Call(api.Request{Op: api.OpDel, Network: network, ContainerID: fmt.Sprint("a", i), IfName: "eth0"})
		if err != nil || resp.Released != 1 {
			t.Fatalf("DEL a%d on the resumed node: %+v %v", i, resp, err)
		}
	}
	if after := leaseSet(t, b); !slices.Equal(after, bBefore) {
		t.Fatalf("the new owner's leases changed when the old owner released its lost ones:\nbefore %v\nafter  %v", bBefore, after)
	}
	if cur, _ := blockNamed(blocksOf(t, b), blockA.Block); cur.Owner != blockNow.Owner || cur.Epoch != blockNow.Epoch {
		t.Fatalf("block record changed by the old owner's DELs: %+v, was %+v", cur, blockNow)
	}
	if len(a.Leases(t)) != 0 {
		t.Fatalf("leases left on %s: %v", a.name, a.Leases(t))
	}
	mustBalance(t, nodes)
	// the metrics say what happened: b claimed two blocks (its own, then the
	// reclaimed one) and reclaimed one; a was suspended once and owns nothing now
	for _, m := range []struct {
		n    *node
		name string
		want float64
	}{
		{b, "ipledger_block_claims_total", 2}, {b, "ipledger_block_reclaims_total", 1}, {b, "ipledger_blocks_owned", 2},
		{a, "ipledger_block_claims_total", 1}, {a, "ipledger_fencing_suspensions_total", 1}, {a, "ipledger_blocks_owned", 0},
	} {
		if got := m.n.metric(t, m.name); got != m.want {
			t.Errorf("%s %s = %v, want %v", m.n.name, m.name, got, m.want)
		}
	}
	// block LISTs are counted (the network's set-up lists once at least; how many in
	// all is checked against the datastore's count in internal/cluster)
	for _, n := range nodes {
		if got := n.metric(t, "ipledger_block_lists_total"); got < 1 {
			t.Errorf("%s ipledger_block_lists_total = %v, want at least the set-up's 1", n.name, got)
		}
	}
	// leave the books empty for the cleanup audits
	for _, l := range b.Leases(t) {
		if _, err := b.Call(api.Request{Op: api.OpDel, Network: network, ContainerID: l.ContainerID, IfName: "eth0"}); err != nil {
			t.Fatal(err)
		}
	}
}
