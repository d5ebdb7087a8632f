package cluster_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
)

// waitStatus runs the plugin's STATUS until its outcome is want (nil for success,
// else the CNI error code), at most 30s, and returns the last answer.
func waitStatus(t *testing.T, p *pluginRunner, n *node, want int) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := p.exec(n, "STATUS", "")
		code := 0
		var ce *cniError
		if errors.As(err, &ce) {
			code = int(ce.Code)
		} else if err != nil && !errors.Is(err, errPluginTryAgain) {
			t.Fatalf("STATUS: %v", err)
		}
		if code == want && (want != 0 || err == nil) {
			if err != nil {
				return err.Error()
			}
			return "ok"
		}
		if time.Now().After(deadline) {
			t.Fatalf("STATUS did not answer %d within 30s; last: %v", want, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestStatusDegraded: through the real plugin binary, CNI STATUS answers success
// while the node can allocate, 50 (plugin not available) with "degraded" once its
// blocks are full and etcd is gone, and success again once etcd is back; DEL works
// throughout, and the ADD that needs a block answers "try again later" (11) and
// succeeds when etcd is back.
func TestStatusDegraded(t *testing.T) {
	sideBySideWhenShort(t)
	ec := etcdenv.StartCluster(t, 1)
	n := startNodes(t, 1, []string{"--datastore", "etcd", "--etcd-endpoints", strings.Join(ec.Endpoints(), ",")})[0]
	p := newPluginRunner(t)
	p.blockSize = 30
	waitStatus(t, p, n, 0)
	// fill the first block: ADDs until one lands outside it
	var cids []string
	first := ""
	for i := 0; ; i++ {
		cid := fmt.Sprint("c", i)
		resp, err := call(n, api.Request{Op: api.OpAdd, Network: network, ContainerID: cid, IfName: "eth0", Ranges: ranges(t), BlockSize: 30})
		if err != nil {
			t.Fatal(err)
		}
		cids = append(cids, cid)
		if first == "" {
			first = resp.Lease.Block
		} else if resp.Lease.Block != first {
			break // the second block is claimed: fill it too, below
		}
	}
	// Fill the node's blocks with etcd gone: the agent claims a block ahead of
	// need in the background, so with etcd up they may never fill. ADDs are
	// local until the node's blocks are full; the first one that needs a block
	// answers "unavailable". It took the claim lock, so any claim started
	// before etcd went has ended, and none can start after: the blocks stay full.
	ec.Kill(0)
	for i := len(cids); ; i++ {
		cid := fmt.Sprint("c", i)
		_, err := n.Call(api.Request{Op: api.OpAdd, Network: network, ContainerID: cid, IfName: "eth0", Ranges: ranges(t), BlockSize: 30})
		var ae *api.Error
		if errors.As(err, &ae) && ae.Code == api.CodeUnavailable {
			if !strings.Contains(err.Error(), "no free address in the node's") {
				t.Fatalf("ADD %s with etcd gone: %v, want unavailable because the node's blocks are full", cid, err)
			}
			break // the node's blocks are full
		}
		if err != nil {
			t.Fatalf("ADD %s with etcd gone: %v", cid, err)
		}
		cids = append(cids, cid)
		if i > 20 {
			t.Fatal("the node's blocks never filled")
		}
	}
	msg := waitStatus(t, p, n, 50)
	if !strings.Contains(msg, "degraded") {
		t.Errorf("STATUS 50 without saying degraded: %s", msg)
	}
	t.Logf("STATUS with full blocks and etcd gone: %s", msg)
	if _, err := p.add(n, "needs-a-block"); !errors.Is(err, errPluginTryAgain) {
		t.Errorf("ADD needing a block with etcd gone: %v, want CNI error 11", err)
	}
	if err := p.del(n, cids[0]); err != nil {
		t.Fatalf("DEL with etcd gone: %v", err)
	}
	ec.Restart(0)
	waitStatus(t, p, n, 0)
	if _, err := call(n, api.Request{Op: api.OpAdd, Network: network, ContainerID: "needs-a-block", IfName: "eth0", Ranges: ranges(t), BlockSize: 30}); err != nil {
		t.Fatalf("ADD after etcd is back: %v", err)
	}
	mustBalance(t, []*node{n})
	for _, cid := range append(cids[1:], "needs-a-block") {
		if _, err := n.Call(api.Request{Op: api.OpDel, Network: network, ContainerID: cid, IfName: "eth0"}); err != nil {
			t.Fatal(err)
		}
	}
}
