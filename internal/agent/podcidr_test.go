package agent_test

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/pool"
)

// podCIDRs stands for the Node watch: what it answers can change under the test.
type podCIDRs struct {
	mu    sync.Mutex
	cidrs []netip.Prefix
	err   error
}

func (p *podCIDRs) PodCIDRs() ([]netip.Prefix, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cidrs, p.err
}

func (p *podCIDRs) set(cidrs []netip.Prefix, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cidrs, p.err = cidrs, err
}

func placeholderReq(t *testing.T, op, cid string) api.Request {
	t.Helper()
	sets := ledgertest.Ranges(t, `[[{"subnet":"usePodCidr"}]]`)
	return api.Request{Version: api.Version, Op: op, Network: "k8s-pod-network", ContainerID: cid, IfName: "eth0", Ranges: sets}
}

func wantCode(t *testing.T, what string, err error, code, says string) {
	t.Helper()
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != code || !strings.Contains(ae.Msg, says) {
		t.Fatalf("%s: %v, want code %s saying %q", what, err, code, says)
	}
	t.Logf("%s: %s", what, ae.Msg)
}

// TestUsePodCIDR: an ADD of a usePodCidr range allocates from the node's podCIDR;
// without a Node watch it is refused naming the flag; while the Node has no podCIDR
// ADD and STATUS answer "unavailable" (the plugin's codes 11 and 50) naming the Node
// and the fix, and nothing is allocated.
func TestUsePodCIDR(t *testing.T) {
	t.Run("no node watch", func(t *testing.T) {
		s := serve(t, nil)
		_, err := s.call(t, placeholderReq(t, api.OpAdd, "c0"))
		wantCode(t, "ADD", err, api.CodeInvalid, "--node-name")
	})
	src := &podCIDRs{err: fmt.Errorf(`Node "n1": the Node has no spec.podCIDRs; run kube-controller-manager with --allocate-node-cidrs`)}
	s := serve(t, func(c *agent.Config) { c.PodCIDRs = src })
	_, err := s.call(t, placeholderReq(t, api.OpAdd, "c1"))
	wantCode(t, "ADD before the podCIDR", err, api.CodeUnavailable, "--allocate-node-cidrs")
	_, err = s.call(t, placeholderReq(t, api.OpStatus, ""))
	wantCode(t, "STATUS before the podCIDR", err, api.CodeUnavailable, `Node "n1"`)
	if n := len(s.l.Leases("")); n != 0 {
		t.Fatalf("%d leases after refused ADDs", n)
	}

	src.set([]netip.Prefix{netip.MustParsePrefix("fd00:1::/64")}, nil)
	_, err = s.call(t, placeholderReq(t, api.OpAdd, "c1"))
	wantCode(t, "ADD with only an IPv6 podCIDR", err, api.CodeUnavailable, "no IPv4 podCIDR")

	src.set([]netip.Prefix{netip.MustParsePrefix("10.244.7.0/24")}, nil)
	resp, err := s.call(t, placeholderReq(t, api.OpAdd, "c1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Lease.IPs) != 1 || !netip.MustParsePrefix("10.244.7.0/24").Contains(netip.MustParseAddr(strings.Split(resp.Lease.IPs[0], "/")[0])) {
		t.Fatalf("ADD gave %+v, want an address of 10.244.7.0/24", resp.Lease)
	}
	if _, err := s.call(t, placeholderReq(t, api.OpStatus, "")); err != nil {
		t.Fatalf("STATUS with the podCIDR: %v", err)
	}
	ps, err := s.l.Pool("k8s-pod-network")
	if want := "[[10.244.7.0/24(10.244.7.1-10.244.7.254)]]"; err != nil || pool.SetsString(ps.Ranges) != want {
		t.Fatalf("the pool holds %v (%v), want the resolved podCIDR", ps.Ranges, err)
	}
}

// TestPodCIDRChange: when the Node's podCIDR changes under a live lease, the next ADD
// gets an address of the new podCIDR, the old lease is kept (an ADD again gives it
// back), doctor warns naming the node, both podCIDRs and the leases left in the old
// one, and the old lease's DEL releases it, after which doctor no longer warns and
// the books balance.
func TestPodCIDRChange(t *testing.T) {
	src := &podCIDRs{cidrs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}
	s := serve(t, func(c *agent.Config) { c.PodCIDRs, c.Node = src, "worker-1" })
	addIn := func(cid, subnet string) api.LeaseView {
		t.Helper()
		resp, err := s.call(t, placeholderReq(t, api.OpAdd, cid))
		if err != nil {
			t.Fatalf("ADD %s: %v", cid, err)
		}
		if len(resp.Lease.IPs) != 1 || !netip.MustParsePrefix(subnet).Contains(netip.MustParsePrefix(resp.Lease.IPs[0]).Addr()) {
			t.Fatalf("ADD %s gave %v, want an address of %s", cid, resp.Lease.IPs, subnet)
		}
		return *resp.Lease
	}
	podCIDRWarnings := func() []string {
		t.Helper()
		resp, err := s.call(t, api.Request{Version: api.Version, Op: api.OpDoctor})
		if err != nil {
			t.Fatal(err)
		}
		if !resp.Doctor.BooksBalanced {
			t.Fatalf("books do not balance: %v", resp.Doctor.Problems)
		}
		var out []string
		for _, c := range resp.Doctor.NetworkChecks {
			if strings.Contains(c.Text, "podCIDR changed") {
				if c.Level != api.CheckWarn {
					t.Fatalf("%s %s, want WARN", c.Level, c.Text)
				}
				out = append(out, c.Text)
			}
		}
		return out
	}

	old := addIn("c1", "10.244.1.0/24")
	if w := podCIDRWarnings(); len(w) != 0 {
		t.Fatalf("doctor warns before any change: %v", w)
	}
	src.set([]netip.Prefix{netip.MustParsePrefix("10.244.9.0/24")}, nil)
	addIn("c2", "10.244.9.0/24")
	if again := addIn("c1", "10.244.1.0/24"); again.IPs[0] != old.IPs[0] {
		t.Fatalf("ADD again of c1 gave %v, want its lease %v", again.IPs, old.IPs)
	}
	w := podCIDRWarnings()
	want := `node "worker-1": podCIDR changed from 10.244.1.0/24 to 10.244.9.0/24; 1 live lease of network "k8s-pod-network" still holds an address in 10.244.1.0/24: other nodes no longer route 10.244.1.0/24 to this node`
	if len(w) != 1 || !strings.HasPrefix(w[0], want) {
		t.Fatalf("doctor says %q, want one WARN starting %q", w, want)
	}
	t.Logf("doctor: WARN %s", w[0])

	resp, err := s.call(t, placeholderReq(t, api.OpDel, "c1"))
	if err != nil || resp.Released != 1 {
		t.Fatalf("DEL of the old lease: %+v, %v", resp, err)
	}
	if w := podCIDRWarnings(); len(w) != 0 {
		t.Fatalf("doctor still warns after the old lease's DEL: %v", w)
	}
	resp, err = s.call(t, api.Request{Version: api.Version, Op: api.OpAudit})
	if err != nil || !resp.Audit.OK {
		t.Fatalf("audit after the change: %+v, %v", resp.Audit, err)
	}
	h, err := s.l.History("k8s-pod-network", netip.MustParsePrefix(old.IPs[0]).Addr())
	if err != nil || len(h) != 1 {
		t.Fatalf("history of the old address: %+v, %v; want its DEL", h, err)
	}
	addIn("c3", "10.244.9.0/24")
}
