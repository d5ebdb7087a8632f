package cluster_test

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
)

// TestBlocksCommand: `ipledgerctl blocks` on a cluster-mode agent prints the block
// with its owner, epoch, state and the node's used/free (table and YAML); on a
// node-mode agent it exits 2 saying so; `cluster-audit` exits 2 when an agent cannot
// be reached.
func TestBlocksCommand(t *testing.T) {
	sideBySideWhenShort(t)
	ec := etcdenv.StartCluster(t, 1)
	n := startNodes(t, 1, []string{"--datastore", "etcd", "--etcd-endpoints", strings.Join(ec.Endpoints(), ",")})[0]
	if _, err := call(n, api.Request{Op: api.OpAdd, Network: network, ContainerID: "c1", IfName: "eth0", Ranges: ranges(t)}); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := agentenv.Ctl(t, "--socket", n.Socket, "blocks")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NETWORK BLOCK OWNER EPOCH STATE USED FREE" {
		t.Fatalf("blocks (exit %d):\n%s%s", code, out, errOut)
	}
	// the block is where the node's claims start (a hash of the node's name): any
	// /26 of the pool; its usable addresses are 64 less the pool's network address
	f := strings.Fields(lines[1])
	blk, err := netip.ParsePrefix(f[1])
	if len(f) != 7 || f[0] != "pods" || err != nil || blk.Bits() != 26 || !netip.MustParsePrefix(subnet).Contains(blk.Addr()) ||
		f[2] != "node-0" || f[3] != "1" || f[4] != "owned" || f[5] != "1" || (f[6] != "63" && f[6] != "62") {
		t.Fatalf("blocks row %q", lines[1])
	}
	out, _, code = agentenv.Ctl(t, "--socket", n.Socket, "blocks", "-o", "yaml")
	var bs []api.BlockView
	if err := yaml.Unmarshal([]byte(out), &bs); code != 0 || err != nil || len(bs) != 1 || bs[0].Owner != "node-0" || bs[0].Used == nil || *bs[0].Used != 1 {
		t.Fatalf("blocks -o yaml (exit %d, %v):\n%s", code, err, out)
	}
	if _, err := n.Call(api.Request{Op: api.OpDel, Network: network, ContainerID: "c1", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}

	plain := agentenv.Start(t, agentenv.Options{})
	if _, errOut, code := agentenv.Ctl(t, "--socket", plain.Socket, "blocks"); code != 2 || !strings.Contains(errOut, "node mode") {
		t.Errorf("blocks on a node-mode agent: exit %d, %q", code, errOut)
	}
	missing := filepath.Join(t.TempDir(), "none.sock")
	if _, errOut, code := agentenv.Ctl(t, "cluster-audit", "--socket", n.Socket, "--socket", missing); code != 2 || !strings.Contains(errOut, missing) {
		t.Errorf("cluster-audit with an unreachable agent: exit %d, %q", code, errOut)
	}
}
