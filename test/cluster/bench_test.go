package cluster_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
)

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func reportADD(b *testing.B, name string, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	b.ReportMetric(float64(percentile(d, 0.5).Microseconds())/1000, name+"-p50-ms")
	b.ReportMetric(float64(percentile(d, 0.99).Microseconds())/1000, name+"-p99-ms")
}

// addDel is one ADD (timed) and one DEL through the agent's socket.
func addDel(b *testing.B, a *agentenv.Agent, cid string, blockSize int) time.Duration {
	sets := ledgertest.Ranges(b, rangesJSON)
	t0 := time.Now()
	if _, err := a.Call(api.Request{Op: api.OpAdd, Network: network, ContainerID: cid, IfName: "eth0", Ranges: sets, BlockSize: blockSize}); err != nil {
		b.Fatal(err)
	}
	d := time.Since(t0)
	if _, err := a.Call(api.Request{Op: api.OpDel, Network: network, ContainerID: cid, IfName: "eth0"}); err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkAddOwnedBlock: ADD latency through the socket of an ipledgerd process, in
// node mode and in cluster mode (a single etcd-server process) where every ADD is
// served from a block the node already owns (no datastore call). Each op is one ADD
// and one DEL; the reuse delay is 0 in both, so one block serves them all. Reports
// p50/p99 of the ADDs; the goal is cluster p99 <= 1.2x node mode.
func BenchmarkAddOwnedBlock(b *testing.B) {
	ec := etcdenv.StartCluster(b, 1)
	for _, c := range []struct {
		name string
		args []string
	}{
		{"node", []string{"--reuse-delay", "0s"}},
		{"cluster", []string{"--reuse-delay", "0s", "--node-name", "bench-0", "--datastore", "etcd", "--etcd-endpoints", strings.Join(ec.Endpoints(), ","), "--routes=false", "--masquerade=false"}},
	} {
		b.Run(c.name, func(b *testing.B) {
			a := agentenv.Start(b, agentenv.Options{Args: c.args})
			addDel(b, a, "warm", 0) // the cluster agent claims its block here
			var ds []time.Duration
			b.ResetTimer()
			for i := range b.N {
				ds = append(ds, addDel(b, a, fmt.Sprint("c", i), 0))
			}
			b.StopTimer()
			reportADD(b, "add", ds)
		})
	}
}

// BenchmarkAddClaimsBlock: ADDs (no DELs) in /30 blocks, so about every fourth ADD
// must claim a block from etcd (a single etcd-server process) before it answers.
// Reports p50/p99 of the ADDs that claimed (their address in a block not seen
// before) and of the others; the goal is claim p99 <= 250 ms.
func BenchmarkAddClaimsBlock(b *testing.B) {
	ec := etcdenv.StartCluster(b, 1)
	a := agentenv.Start(b, agentenv.Options{Args: append([]string{"--node-name", "bench-0", "--datastore", "etcd", "--etcd-endpoints", strings.Join(ec.Endpoints(), ",")}, hostNetworkOff...)})
	sets := ledgertest.Ranges(b, rangesJSON)
	seen := map[netip.Prefix]bool{}
	var claimed, owned []time.Duration
	var cids []string
	b.ResetTimer()
	for i := range b.N {
		cid := fmt.Sprint("c", i)
		t0 := time.Now()
		resp, err := a.Call(api.Request{Op: api.OpAdd, Network: network, ContainerID: cid, IfName: "eth0", Ranges: sets, BlockSize: 30})
		d := time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		cids = append(cids, cid)
		blk, _ := netip.MustParsePrefix(resp.Lease.IPs[0]).Addr().Prefix(30)
		if !seen[blk] {
			seen[blk] = true
			claimed = append(claimed, d)
		} else {
			owned = append(owned, d)
		}
	}
	b.StopTimer()
	reportADD(b, "claim", claimed)
	reportADD(b, "owned", owned)
	for _, cid := range cids {
		if _, err := a.Call(api.Request{Op: api.OpDel, Network: network, ContainerID: cid, IfName: "eth0"}); err != nil {
			b.Fatal(err)
		}
	}
}
