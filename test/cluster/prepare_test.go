package cluster_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
)

// TestPrepareAtStart: an agent given --conflist (the file install-cni installs)
// sets that network up and claims the node's first block before any ADD; its
// first ADDs then claim nothing; a graceful restart claims nothing more.
func TestPrepareAtStart(t *testing.T) {
	sideBySideWhenShort(t)
	ec := etcdenv.StartCluster(t, 1)
	conflist := filepath.Join(t.TempDir(), "10-ipledger.conflist")
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":%q,"plugins":[{"type":"ipledger-veth","ipam":{"type":"ipledger","blockSize":26,"ranges":%s}},{"type":"portmap"}]}`, network, rangesJSON)
	if err := os.WriteFile(conflist, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	n := startNodes(t, 1, []string{"--datastore", "etcd", "--etcd-endpoints", strings.Join(ec.Endpoints(), ","), "--conflist", conflist})[0]
	// prepared waits for the agent's k-th "set up before its first ADD" line and
	// returns the blocks it says it claimed
	prepared := func(k int) string {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			b, err := os.ReadFile(n.Log)
			if err != nil {
				t.Fatal(err)
			}
			var lines []string
			for _, l := range strings.Split(string(b), "\n") {
				if strings.Contains(l, `msg="network set up before its first ADD"`) {
					lines = append(lines, l)
				}
			}
			if len(lines) >= k {
				if net := logField(lines[k-1], "network"); net != network {
					t.Fatalf("set up network %q, want %q: %s", net, network, lines[k-1])
				}
				return logField(lines[k-1], "blocks_claimed")
			}
			if time.Now().After(deadline) {
				t.Fatalf("the agent never said it set the network up (%d times so far)", len(lines))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if got := prepared(1); got != "1" {
		t.Fatalf("claimed %s blocks at start, want 1", got)
	}
	owned := ownedBy(blocksOf(t, n), n.name)
	if len(owned) != 1 {
		t.Fatalf("%s owns %+v before any ADD, want one block", n.name, owned)
	}
	if c, a := n.metric(t, "ipledger_block_claims_total"), n.metric(t, "ipledger_block_claims_ahead_total"); c != 1 || a != 1 {
		t.Fatalf("claims %v, ahead %v; want the one claim, made ahead", c, a)
	}
	for i := range 10 {
		resp, err := call(n, api.Request{Op: api.OpAdd, Network: network, ContainerID: fmt.Sprint("c", i), IfName: "eth0", Ranges: ranges(t), BlockSize: 26})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Lease.Block != owned[0].Block {
			t.Fatalf("ADD c%d got %v in block %s, want the block claimed at start (%s)", i, resp.Lease.IPs, resp.Lease.Block, owned[0].Block)
		}
	}
	if c := n.metric(t, "ipledger_block_claims_total"); c != 1 {
		t.Fatalf("%v claims after 10 ADDs, want only the one made at start", c)
	}
	if err := n.Stop(); err != nil {
		t.Fatal(err)
	}
	n.Restart()
	if got := prepared(2); got != "0" {
		t.Fatalf("claimed %s blocks at the restart, want 0", got)
	}
	if now := ownedBy(blocksOf(t, n), n.name); len(now) != 1 || now[0].Block != owned[0].Block || now[0].Epoch != owned[0].Epoch {
		t.Fatalf("%s owns %+v after a restart, want %+v unchanged", n.name, now, owned)
	}
	for i := range 10 {
		if _, err := call(n, api.Request{Op: api.OpDel, Network: network, ContainerID: fmt.Sprint("c", i), IfName: "eth0"}); err != nil {
			t.Fatal(err)
		}
	}
}
