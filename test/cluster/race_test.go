package cluster_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
)

// TestClaimRace: five agent processes with no block each send their first ADD at the
// same moment into a pool of four /26 blocks: four get an address, each in a block of
// its own (every block has exactly one winner), the fifth is answered "exhausted"
// (no borrowing), and the cluster audit balances.
func TestClaimRace(t *testing.T) {
	sideBySideWhenShort(t)
	ec := etcdenv.StartCluster(t, 1)
	nodes := startNodes(t, 5, []string{"--datastore", "etcd", "--etcd-endpoints", strings.Join(ec.Endpoints(), ",")})
	sets := ledgertest.Ranges(t, `[[{"subnet":"10.80.0.0/24"}]]`)
	start := make(chan struct{})
	var wg sync.WaitGroup
	blocks := make([]string, len(nodes))
	errs := make([]*api.Error, len(nodes))
	for i, n := range nodes {
		wg.Go(func() {
			<-start
			resp, err := call(n, api.Request{Op: api.OpAdd, Network: network, ContainerID: n.name + "-first", IfName: "eth0", Ranges: sets})
			if err != nil {
				ae, ok := err.(*api.Error)
				if !ok {
					t.Errorf("%s: ADD: %v", n.name, err)
					return
				}
				errs[i] = ae
				return
			}
			blocks[i] = resp.Lease.Block
		})
	}
	close(start)
	wg.Wait()
	owners := map[string]string{}
	losers := 0
	for i, n := range nodes {
		switch {
		case errs[i] != nil:
			if errs[i].Code != api.CodeExhausted {
				t.Errorf("%s: %v, want %q", n.name, errs[i], api.CodeExhausted)
			}
			losers++
		case owners[blocks[i]] != "":
			t.Errorf("block %s won by %s and %s", blocks[i], owners[blocks[i]], n.name)
		default:
			owners[blocks[i]] = n.name
		}
	}
	if len(owners) != 4 || losers != 1 {
		t.Fatalf("four blocks among five racing nodes: winners %v, %d refused", owners, losers)
	}
	for _, b := range blocksOf(t, nodes[0]) {
		if owners[b.Block] != b.Owner {
			t.Errorf("datastore says %s is %q's, the ADD answers say %q's", b.Block, b.Owner, owners[b.Block])
		}
	}
	t.Logf("claim race: %v", fmt.Sprint(owners))
	mustBalance(t, nodes)
	for i, n := range nodes {
		if errs[i] == nil {
			if _, err := n.Call(api.Request{Op: api.OpDel, Network: network, ContainerID: n.name + "-first", IfName: "eth0"}); err != nil {
				t.Fatal(err)
			}
		}
	}
}
