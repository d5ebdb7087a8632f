package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cniplugin"
	"github.com/ipledger/ipledger/internal/ipam"
	"github.com/ipledger/ipledger/internal/nodenet"
	"github.com/ipledger/ipledger/internal/nodenet/controller"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// gateNodes stands for the Node watch: listed or not, with what Nodes.
type gateNodes struct {
	mu     sync.Mutex
	synced bool
	list   []nodenet.Node
}

func (n *gateNodes) Synced() bool             { n.mu.Lock(); defer n.mu.Unlock(); return n.synced }
func (n *gateNodes) Nodes() []nodenet.Node    { n.mu.Lock(); defer n.mu.Unlock(); return n.list }
func (n *gateNodes) Changed() <-chan struct{} { return nil }

// gateMasq stands for the masquerade rules: each sync answers err.
type gateMasq struct {
	mu  sync.Mutex
	err error
}

func (m *gateMasq) Sync(_, _ []netip.Prefix) error { m.mu.Lock(); defer m.mu.Unlock(); return m.err }
func (m *gateMasq) set(err error)                  { m.mu.Lock(); m.err = err; m.mu.Unlock() }

// TestAddWaitsForTheNodeNetwork: after a start (a reboot), until the node network's
// controller has reconciled once without error (the Nodes listed, the masquerade
// rules synced), the IPAM plugin's ADD answers CNI code 11 (try again later) and
// STATUS code 50, naming what is awaited, and nothing is allocated; after it, both
// succeed, and a later failed reconciliation does not hold pods back again.
func TestAddWaitsForTheNodeNetwork(t *testing.T) {
	nodes := &gateNodes{}
	mq := &gateMasq{}
	ctl, err := controller.New(controller.Config{Self: "n1", Nodes: nodes, Masquerade: mq, Resync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	s := serve(t, func(c *agent.Config) { c.NodeNetwork = ctl })
	nsPath := netenv.Namespace(t, "ipl").Path
	var stdout, stderr bytes.Buffer
	p := &ipam.Plugin{Call: api.Call, Stdout: &stdout, Stderr: &stderr, Now: time.Now}
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"k8s-pod-network","type":"ipledger","ipam":{"type":"ipledger","socket":%q,"ranges":[[{"subnet":"10.85.0.0/24"}]]}}`, s.socket)
	args := func(cid string) *cniplugin.Args {
		return &cniplugin.Args{ContainerID: cid, Netns: nsPath, IfName: "eth0", StdinData: []byte(conf)}
	}
	wantCNI := func(what string, err error, code uint, says string) {
		t.Helper()
		var ce *cniplugin.Error
		if !errors.As(err, &ce) || ce.Code != code || !strings.Contains(ce.Msg, says) {
			t.Fatalf("%s: %v, want CNI code %d saying %q", what, err, code, says)
		}
		t.Logf("%s: code %d: %s", what, ce.Code, ce.Msg)
	}
	ctx := context.Background()

	ctl.Reconcile(ctx)
	wantCNI("ADD before the Nodes are listed", p.Add(args("c1")), cniplugin.ErrTryAgainLater, "the Nodes have not been listed yet")
	wantCNI("STATUS before the Nodes are listed", p.Status(args("")), cniplugin.ErrPluginNotAvailable, "node network not ready")

	nodes.mu.Lock()
	nodes.synced, nodes.list = true, []nodenet.Node{{Name: "n1", Addrs: []netip.Addr{netip.MustParseAddr("10.250.0.11")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.85.0.0/24")}}}
	nodes.mu.Unlock()
	mq.set(errors.New("nft: netlink: busy"))
	ctl.Reconcile(ctx)
	wantCNI("ADD before the masquerade rules synced", p.Add(args("c1")), cniplugin.ErrTryAgainLater, "masquerade: nft: netlink: busy")
	wantCNI("STATUS before the masquerade rules synced", p.Status(args("")), cniplugin.ErrPluginNotAvailable, "masquerade: nft: netlink: busy")
	if n := len(s.l.Leases("")); n != 0 {
		t.Fatalf("%d leases after ADDs refused for the node network", n)
	}

	mq.set(nil)
	ctl.Reconcile(ctx)
	if err := p.Status(args("")); err != nil {
		t.Fatalf("STATUS after the first sync: %v", err)
	}
	if err := p.Add(args("c1")); err != nil {
		t.Fatalf("ADD after the first sync: %v", err)
	}
	mq.set(errors.New("nft: netlink: busy"))
	ctl.Reconcile(ctx)
	if err := p.Add(args("c2")); err != nil {
		t.Fatalf("ADD after a later failed sync: %v", err)
	}
	if n := len(s.l.Leases("")); n != 2 {
		t.Fatalf("%d leases after two ADDs answered, want 2", n)
	}
}
