// Package ledgerview shows the ledger's records as the protocol's types (internal/api):
// the one place a ledger type becomes a type of the wire and of `ipledgerctl -o
// json|yaml`. The agent and the reconciler answer through it; the plugins, which speak
// only the protocol, do not link the ledger.
package ledgerview

import (
	"fmt"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
)

// Lease shows a lease; ranges give each address's gateway.
func Lease(ls ledger.Lease, ranges []pool.RangeSet) api.LeaseView {
	v := api.LeaseView{Network: ls.Key.Network, ContainerID: ls.Key.ContainerID, IfName: ls.Key.IfName,
		Namespace: ls.Pod.Namespace, Name: ls.Pod.Name, UID: ls.Pod.UID, Infra: ls.Pod.InfraContainerID, NetNS: ls.NetNS.Path,
		Created: ls.Created, State: ls.State, Why: ls.Why, Pool: ls.Pool, IPs: []string{}}
	if ls.NetNS.Ino != 0 {
		v.NetNSID = fmt.Sprintf("%d:%d", ls.NetNS.Dev, ls.NetNS.Ino)
	}
	for _, p := range ls.IPs {
		v.IPs = append(v.IPs, p.String())
		gw := ""
		for _, set := range ranges {
			if r, ok := set.RangeOf(p.Addr()); ok && r.Gateway.IsValid() {
				gw = r.Gateway.String()
			}
		}
		v.Gateways = append(v.Gateways, gw)
	}
	return v
}

// Key shows an attachment's key.
func Key(k ledger.Key) api.Key {
	return api.Key{Network: k.Network, ContainerID: k.ContainerID, IfName: k.IfName}
}

// Pod shows a lease's pod.
func Pod(p ledger.Pod) api.Pod {
	return api.Pod{Namespace: p.Namespace, Name: p.Name, UID: p.UID, InfraContainerID: p.InfraContainerID}
}

// Release shows one entry of an address's history.
func Release(r ledger.Release) api.Release {
	return api.Release{Network: r.Network, IP: r.IP, Key: Key(r.Key), Pod: Pod(r.Pod), From: r.From, To: r.To,
		Reason: string(r.Reason), Detail: r.Detail, Why: r.Why, Seq: r.Seq}
}

// Releases shows an address's history; nil stays nil.
func Releases(h []ledger.Release) []api.Release {
	if h == nil {
		return nil
	}
	out := make([]api.Release, len(h))
	for i, r := range h {
		out[i] = Release(r)
	}
	return out
}

// Pool shows a network's pool status.
func Pool(ps ledger.PoolStatus) api.PoolStatus {
	v := api.PoolStatus{Network: ps.Network, Ranges: ps.Ranges, Usable: ps.Usable, InUse: ps.InUse, Free: ps.Free,
		Available: ps.Available, Allocs: ps.Allocs, Releases: ps.Releases, BlockBits: ps.BlockBits}
	if r := ps.Replaced; r != nil {
		v.Replaced = &api.PoolReplacement{At: r.At, FromRanges: r.FromRanges, FromBlockBits: r.FromBlockBits, Reason: r.Reason}
	}
	for _, r := range ps.Retired {
		v.Retired = append(v.Retired, api.RetiredSet{Ranges: r.Ranges, Leases: r.Leases})
	}
	return v
}

// Doubles shows the addresses an audit found held twice; nil stays nil.
func Doubles(ds []ledger.DoubleAssigned) []api.DoubleAssigned {
	if ds == nil {
		return nil
	}
	out := make([]api.DoubleAssigned, len(ds))
	for i, d := range ds {
		out[i] = api.DoubleAssigned{Network: d.Network, IP: d.IP}
		if d.Holders != nil {
			out[i].Holders = make([]api.Key, len(d.Holders))
			for j, k := range d.Holders {
				out[i].Holders[j] = Key(k)
			}
		}
	}
	return out
}

// Pools shows an audit's pool balances; nil stays nil.
func Pools(ps []ledger.PoolAudit) []api.PoolAudit {
	if ps == nil {
		return nil
	}
	out := make([]api.PoolAudit, len(ps))
	for i, p := range ps {
		out[i] = api.PoolAudit{Network: p.Network, Allocations: p.Allocations, Releases: p.Releases, Live: p.Live, Free: p.Free}
	}
	return out
}
