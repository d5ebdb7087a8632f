package agent

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/ledger"
)

// clusterChecks are doctor's cluster-mode checks: the datastore (last call's outcome
// and age), the node lease (time left before fencing), each network's blocks, and the
// leases left in blocks the node lost. They read the manager's and the ledger's state
// only: doctor makes no datastore call, so it answers while the datastore is away.
func (s *Server) clusterChecks(pools []api.PoolUse) []api.Check {
	c := s.cfg.Cluster
	h := c.Health()
	var out []api.Check
	add := func(level, format string, a ...any) {
		out = append(out, api.Check{Level: level, Text: fmt.Sprintf(format, a...)})
	}
	ds := s.cfg.Datastore
	if ds == "" {
		ds = "datastore"
	}
	dsFix := fmt.Sprintf("fix: check the %s datastore (etcd members' health, or the kube-apiserver) and this node's path to it (--etcd-endpoints or the in-cluster credentials), and read ipledgerd's log", ds)
	switch {
	case !h.Called:
		add(api.CheckWarn, "datastore (%s): not contacted yet since the agent started; %s", ds, dsFix)
	case h.Reachable:
		add(api.CheckOK, "datastore (%s) reachable: the last call, %s ago, succeeded", ds, age(h.LastCallAge))
	case h.SinceSuccess > h.LeaseTTL:
		add(api.CheckFail, "datastore (%s) unreachable for %s, longer than the node lease's TTL (%s): the last call, %s ago, failed: %s; other nodes may reclaim this node's blocks after their quarantine; %s", ds, age(h.SinceSuccess), h.LeaseTTL, age(h.LastCallAge), h.LastError, dsFix)
	case h.Provable:
		add(api.CheckWarn, "datastore (%s): the last call, %s ago, failed: %s; the node lease is still provable for %s, so ADDs are served from the node's blocks meanwhile; %s", ds, age(h.LastCallAge), h.LastError, age(h.ProvableFor), dsFix)
	default:
		add(api.CheckWarn, "datastore (%s): the last call, %s ago, failed: %s (unreachable for %s, the lease TTL is %s); %s", ds, age(h.LastCallAge), h.LastError, age(h.SinceSuccess), h.LeaseTTL, dsFix)
	}
	if h.Provable {
		add(api.CheckOK, "node lease of %s provable: %s left before fencing unless it renews (TTL %s)", h.Node, age(h.ProvableFor), h.LeaseTTL)
	} else {
		add(api.CheckFail, "node lease of %s NOT provable: the node is fenced, its blocks are suspended and ADDs fail (DELs still work); fix: restore the datastore connection (see the datastore line); allocation resumes after the next renewal, on the blocks no other node reclaimed meanwhile", h.Node)
	}

	nets := map[string]bool{}
	for _, n := range h.Networks {
		nets[n] = true
	}
	for _, p := range pools {
		nets[p.Network] = true
	}
	names := make([]string, 0, len(nets))
	for n := range nets {
		names = append(names, n)
	}
	sort.Strings(names)
	setUp := map[string]bool{}
	for _, n := range h.Networks {
		setUp[n] = true
	}
	var lost []string
	refused := c.Refused()
	for _, n := range names {
		owned, free := 0, 0
		var lostBlocks, draining []netip.Prefix
		for _, b := range s.cfg.Ledger.Blocks(n) {
			switch b.State {
			case ledger.BlockLost:
				lostBlocks = append(lostBlocks, b.Prefix)
				continue
			case ledger.BlockDraining:
				draining = append(draining, b.Prefix)
				continue
			}
			owned++
			free += max(int(b.Usable)-b.Used, 0)
		}
		lost = append(lost, s.leasesIn(n, lostBlocks, "lost block")...)
		if why := refused[n]; why != "" {
			add(api.CheckWarn, "pool %s: its record is not served as it stands; the node serves the pool as it was: %s; fix: correct the record as the message says (kubectl edit ippool %s)", n, why, n)
		}
		left, back := s.splitDraining(n, draining)
		reuse := age(s.cfg.Ledger.ReuseDelay())
		if len(left) > 0 {
			held := s.leasesIn(n, left, "draining block")
			add(api.CheckWarn, "pool %s: %d blocks draining (their range left the pool), held by %d leases: %s; each block is given back once it has held no lease for the reuse delay (%s); fix: nothing is needed, or delete (or move) those pods to finish the drain now", n, len(left), len(held), strings.Join(held, ", "), reuse)
		}
		if len(back) > 0 {
			held := s.leasesIn(n, back, "draining block")
			add(api.CheckWarn, "pool %s: %d blocks draining since their range was drained; the range is back in the pool (its other blocks are claimable), but these hand out nothing until they are given back, once each has held no lease for the reuse delay (%s), and are then claimable again; held by %d leases: %s; fix: nothing is needed, or delete (or move) those pods to finish the drain now", n, len(back), reuse, len(held), strings.Join(held, ", "))
		}
		st := c.Status(n)
		switch {
		case !setUp[n]:
			add(api.CheckOK, "cluster network %s: %d blocks owned, %d free addresses in them; not set up since the agent started: its next ADD sets it up", n, owned, free)
		case st.Available:
			add(api.CheckOK, "cluster network %s: %d blocks owned, %d free addresses in them", n, owned, free)
		case st.Degraded:
			fix := "fix: restore the datastore connection so the node can claim a block, or free addresses here by deleting pods this node no longer needs"
			if !st.Provable {
				fix = "fix: restore the datastore connection; the node allocates again once its lease renews"
			}
			add(api.CheckFail, "cluster network %s degraded: %s; %d blocks owned, %d free addresses in them; ADDs fail and CNI STATUS reports it; %s", n, st.Reason, owned, free, fix)
		case owned == 0:
			add(api.CheckWarn, "cluster network %s: the node owns no block (another node reclaimed them, or it gave them back); the next ADD must claim one, which fails when the cluster pool has none left; fix: see the free blocks with ipledgerctl blocks, and widen the network's ranges if none is free", n)
		default:
			add(api.CheckWarn, "cluster network %s: no free address in the node's %d blocks; the next ADD must claim a block, which fails when the cluster pool has none left; fix: see the free blocks with ipledgerctl blocks, and widen the network's ranges if none is free", n, owned)
		}
	}
	if len(lost) > 0 {
		add(api.CheckWarn, "%d leases in blocks this node lost: %s; another node may hand out these addresses while the pods still use them; fix: drain this node (kubectl drain) or delete those pods so they restart with addresses from the node's own blocks (their DEL releases them here only)", len(lost), strings.Join(lost, ", "))
	} else {
		add(api.CheckOK, "no lease in a block this node lost")
	}
	return out
}

// PoolAuditor is the cluster's pool and block records as doctor judges them
// (cluster.Manager). Contract: AuditPools reads the manager's watched copies
// only (no datastore call) and changes nothing; while a copy does not run it
// says so (Known false) and judges nothing.
type PoolAuditor interface {
	AuditPools() cluster.PoolAudit
}

var _ PoolAuditor = (*cluster.Manager)(nil)

// poolRecordChecks are doctor's lines on the pool records of the cluster: FAIL
// for each one whose spec does not parse (the pool, the field, the fix); WARN
// for each block of a pool whose record is gone (the block, its owner, the
// leases this node knows in it and the nodes holding its kept addresses), and
// for a block record that does not decode; WARN when the watched copies do not
// run (nothing is judged then); else OK. Nothing is acted on: unknown means
// report.
func (s *Server) poolRecordChecks() []api.Check {
	pa, ok := s.cfg.Cluster.(PoolAuditor)
	if !ok {
		return nil
	}
	a := pa.AuditPools()
	if !a.Known {
		return []api.Check{{Level: api.CheckWarn, Text: fmt.Sprintf("pool records not checked: %s (the agent just started, or the datastore is away); fix: wait for the watch to list, and see the datastore line", a.Cause)}}
	}
	var out []api.Check
	for _, b := range a.Bad {
		out = append(out, api.Check{Level: api.CheckFail, Text: fmt.Sprintf("pool record %s does not parse: %v; no pod gets an address from it (ADDs choosing it fail, nodes serving it keep it as it was); fix: correct it as the message says (kubectl edit ippool %s)", b.Name, b.Err, b.Name)})
	}
	for _, rec := range a.Orphans {
		owner := rec.Owner
		if owner == "" {
			owner = "no node (free)"
		}
		var holds []string
		switch {
		case rec.Owner == s.cfg.Cluster.Node():
			holds = s.leasesIn(rec.Network, []netip.Prefix{rec.CIDR}, "block")
			if len(holds) == 0 {
				holds = []string{"no lease of this node"}
			}
		case rec.Owner != "":
			holds = []string{fmt.Sprintf("the leases of node %s (ipledgerctl doctor there names them)", rec.Owner)}
		}
		for _, b := range rec.Borrows {
			if b.Node != "" {
				holds = append(holds, fmt.Sprintf("%s kept for %s, held by node %s", b.Addr, b.For, b.Node))
			}
		}
		held := "held by nothing"
		if len(holds) > 0 {
			held = "held by " + strings.Join(holds, ", ")
		}
		out = append(out, api.Check{Level: api.CheckWarn, Text: fmt.Sprintf("block %s of pool %s, owner %s: its pool's record (%s) is gone, the IPPool deleted; %s; fix: re-create IPPool %s with a range holding the block, or delete the pods holding it and then the block record (kubectl delete ipblock, or etcdctl del) once nothing holds it", rec.CIDR, rec.Network, owner, cluster.PoolKey(rec.Network), held, rec.Network)})
	}
	for _, k := range a.Unreadable {
		out = append(out, api.Check{Level: api.CheckWarn, Text: fmt.Sprintf("block record %s does not decode; nothing is done with it; fix: inspect it (kubectl get ipblocks -o yaml, or etcdctl get) and correct or delete it", k)})
	}
	if len(out) == 0 {
		out = append(out, api.Check{Level: api.CheckOK, Text: "pool records parse, and every block belongs to a pool"})
	}
	return out
}

// leasesIn names the leases of pool network (a network's own, or a named pool's)
// with an address in one of blocks, a kind of block.
func (s *Server) leasesIn(network string, blocks []netip.Prefix, kind string) []string {
	if len(blocks) == 0 {
		return nil
	}
	var out []string
	for _, ls := range s.cfg.Ledger.Leases("") {
		if ls.PoolNetwork() != network {
			continue
		}
		for _, ip := range ls.IPs {
			var in netip.Prefix
			for _, b := range blocks {
				if b.Contains(ip.Addr()) {
					in = b
				}
			}
			if !in.IsValid() {
				continue
			}
			out = append(out, fmt.Sprintf("pod %s (%s, %s in %s %s)", leaseHolder(ls), network, ip.Addr(), kind, in))
			break
		}
	}
	return out
}

// leaseHolder names a lease's holder: its pod "namespace/name", else its
// container ID's first 12 characters.
func leaseHolder(ls ledger.Lease) string {
	if ls.Pod.Name != "" {
		return ls.Pod.Namespace + "/" + ls.Pod.Name
	}
	who := ls.Key.ContainerID
	if len(who) > 12 {
		who = who[:12]
	}
	return who
}

// Drains tells the ranges of a pool that drain on this node (cluster.Manager).
// Contract: DrainedRanges reads memory only; nil when the node does not serve
// the pool.
type Drains interface {
	DrainedRanges(network string) []netip.Prefix
}

var _ Drains = (*cluster.Manager)(nil)

// fillDraining adds to the pools of an audit (cluster mode) the ranges that
// drain on this node and each draining block of the node with the leases that
// still hold it. It reads memory only.
func (s *Server) fillDraining(ps []api.PoolAudit) {
	for i := range ps {
		ps[i].Drained, ps[i].Draining = s.drainingOf(ps[i].Network)
	}
}

// splitDraining sorts draining blocks of pool network into those whose range is
// still out of the pool (it overlaps a range DrainedRanges names) and those whose
// range is back in it (re-added while the block drained). Without the manager's
// word every block counts as out.
func (s *Server) splitDraining(network string, draining []netip.Prefix) (left, back []netip.Prefix) {
	d, ok := s.cfg.Cluster.(Drains)
	if !ok {
		return draining, nil
	}
	drained := d.DrainedRanges(network)
	for _, b := range draining {
		if slices.ContainsFunc(drained, b.Overlaps) {
			left = append(left, b)
		} else {
			back = append(back, b)
		}
	}
	return left, back
}

// drainingOf is what drains in pool network on this node (cluster mode): the
// subnets of its drained ranges, and each draining block with the leases that
// still hold it. It reads memory only; nil, nil in node mode.
func (s *Server) drainingOf(network string) ([]string, []api.DrainingBlock) {
	d, ok := s.cfg.Cluster.(Drains)
	if !ok {
		return nil, nil
	}
	var drained []string
	out := d.DrainedRanges(network)
	for _, r := range out {
		drained = append(drained, r.String())
	}
	var blocks []api.DrainingBlock
	for _, b := range s.cfg.Ledger.Blocks(network) {
		if b.State != ledger.BlockDraining {
			continue
		}
		db := api.DrainingBlock{Block: b.Prefix.String(), Pods: []string{}, RangeInPool: !slices.ContainsFunc(out, b.Prefix.Overlaps)}
		for _, ls := range s.cfg.Ledger.Leases("") {
			if ls.PoolNetwork() == network && slices.ContainsFunc(ls.IPs, func(ip netip.Prefix) bool { return b.Prefix.Contains(ip.Addr()) }) {
				db.Leases++
				db.Pods = append(db.Pods, leaseHolder(ls))
			}
		}
		sort.Strings(db.Pods)
		blocks = append(blocks, db)
	}
	return drained, blocks
}

// age prints a duration to the millisecond below one second, to the tenth of a
// second below a minute, else to the second.
func age(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
