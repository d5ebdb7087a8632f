package ctl_test

import (
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ctl"
)

func lease(cid string, lost bool, ips ...string) api.LeaseView {
	return api.LeaseView{Network: "pods", ContainerID: cid, IfName: "eth0", IPs: ips, Lost: lost}
}

// TestAuditCluster: the cluster audit's verdict on hand-made views: an address held
// on two nodes, a lease outside its node's blocks, a flagged lost lease, two agents
// with one node name.
func TestAuditCluster(t *testing.T) {
	blocks := []api.BlockView{
		{Network: "pods", Block: "10.0.0.0/26", Owner: "a", Epoch: 1},
		{Network: "pods", Block: "10.0.0.64/26", Owner: "b", Epoch: 3},
		{Network: "pods", Block: "10.0.0.128/26", Owner: "", Epoch: 2},
		// node a's ledger copy of a block it lost: not the datastore's record
		{Network: "pods", Block: "10.0.0.64/26", Owner: "a", Epoch: 2, State: api.BlockLost},
		// a block of IPPool blue, whose leases keep the network's name
		{Network: "blue", Block: "10.1.0.0/26", Owner: "a", Epoch: 1},
	}
	blue := func(cid, ip string) api.LeaseView {
		l := lease(cid, false, ip)
		l.Pool = "blue"
		return l
	}
	for _, c := range []struct {
		name     string
		nodes    []ctl.NodeLeases
		ok       bool
		doubles  int
		lost     int
		problems []string
	}{
		{"balanced", []ctl.NodeLeases{
			{Node: "a", Leases: []api.LeaseView{lease("c1", false, "10.0.0.1/24"), lease("c2", false, "10.0.0.2/24")}},
			{Node: "b", Leases: []api.LeaseView{lease("c3", false, "10.0.0.65/24")}},
		}, true, 0, 0, nil},
		{"held twice across nodes", []ctl.NodeLeases{
			{Node: "a", Leases: []api.LeaseView{lease("c1", true, "10.0.0.65/24")}},
			{Node: "b", Leases: []api.LeaseView{lease("c3", false, "10.0.0.65/24")}},
		}, false, 1, 1, []string{"10.0.0.65 is held 2 times: a:pods/c1/eth0 (lost block), b:pods/c3/eth0"}},
		{"lost and flagged", []ctl.NodeLeases{
			{Node: "a", Leases: []api.LeaseView{lease("c1", true, "10.0.0.66/24")}},
			{Node: "b", Leases: []api.LeaseView{lease("c3", false, "10.0.0.65/24")}},
		}, true, 0, 1, nil},
		{"in another node's block, not flagged", []ctl.NodeLeases{
			{Node: "a", Leases: []api.LeaseView{lease("c1", false, "10.0.0.66/24")}},
		}, false, 0, 0, []string{"lies in block 10.0.0.64/26 owned by b, and the agent does not flag it lost"}},
		{"in a free block", []ctl.NodeLeases{
			{Node: "a", Leases: []api.LeaseView{lease("c1", false, "10.0.0.130/24")}},
		}, false, 0, 0, []string{"owned by nobody"}},
		{"outside every block", []ctl.NodeLeases{
			{Node: "a", Leases: []api.LeaseView{lease("c1", false, "10.9.0.1/24")}},
		}, false, 0, 0, []string{"10.9.0.1 lies in no block of pool pods"}},
		{"a named pool's lease in its pool's block", []ctl.NodeLeases{
			{Node: "a", Leases: []api.LeaseView{blue("c1", "10.1.0.5/26"), lease("c2", false, "10.0.0.1/24")}},
		}, true, 0, 0, nil},
		{"a named pool's lease outside its pool's blocks", []ctl.NodeLeases{
			{Node: "a", Leases: []api.LeaseView{blue("c1", "10.0.0.5/24")}},
		}, false, 0, 0, []string{"10.0.0.5 lies in no block of pool blue"}},
		{"same address twice on one node", []ctl.NodeLeases{
			{Node: "a", Leases: []api.LeaseView{lease("c1", false, "10.0.0.1/24"), lease("c2", false, "10.0.0.1/24")}},
		}, false, 1, 0, []string{"10.0.0.1 is held 2 times"}},
		{"two agents, one node name", []ctl.NodeLeases{
			{Node: "a", Socket: "/s1"}, {Node: "a", Socket: "/s2"},
		}, false, 0, 0, []string{"node a answers on two sockets (/s1 and /s2)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep := ctl.AuditCluster(c.nodes, blocks)
			if rep.OK != c.ok || rep.DoubleAssigned != c.doubles || rep.Lost != c.lost || rep.Blocks != 4 {
				t.Errorf("ok %v doubles %d lost %d blocks %d, want %v %d %d 4: %v", rep.OK, rep.DoubleAssigned, rep.Lost, rep.Blocks, c.ok, c.doubles, c.lost, rep.Problems)
			}
			for _, want := range c.problems {
				if !strings.Contains(strings.Join(rep.Problems, "\n"), want) {
					t.Errorf("problems %q lack %q", rep.Problems, want)
				}
			}
			if c.ok && len(rep.Problems) > 0 {
				t.Errorf("problems on a balanced cluster: %v", rep.Problems)
			}
		})
	}
}
