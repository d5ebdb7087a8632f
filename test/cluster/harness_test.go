// Package cluster_test proves cluster mode with real processes: five ipledgerd agents
// (the built binary, each with its own state, socket and node name) sharing one
// cluster-wide pool through a real datastore (a three-member etcd cluster, or a real
// kube-apiserver), driven concurrently through their sockets and the real plugin
// binary while the datastore loses a member or restarts, and audited with the real
// `ipledgerctl cluster-audit`.
package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ctl"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

const (
	network = "pods"
	// subnet is the cluster-wide pool: 256 blocks of /26.
	subnet = "10.77.0.0/18"
)

var rangesJSON = fmt.Sprintf(`[[{"subnet":%q}]]`, subnet)

func ranges(t testing.TB) []pool.RangeSet {
	t.Helper()
	return ledgertest.Ranges(t, rangesJSON)
}

// node is one agent process with its node name and metrics address.
type node struct {
	name    string
	metrics string
	*agentenv.Agent
}

// metric reads one cluster-mode metric (a counter or gauge without labels) from the
// node's /metrics, as Prometheus parses it.
func (n *node) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + n.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("%s /metrics: %v", n.name, err)
	}
	f := fams[name]
	if f == nil || len(f.Metric) != 1 {
		t.Fatalf("%s /metrics: no single series %s", n.name, name)
	}
	if m := f.Metric[0]; m.Counter != nil {
		return m.Counter.GetValue()
	}
	return f.Metric[0].GetGauge().GetValue()
}

// testTimings are the short cluster timings of the tests: a 3s lease (the quarantine
// as long) so that expiry and reclaim happen within seconds.
var testTimings = []string{"--node-lease-ttl", "3s", "--reclaim-quarantine", "3s", "--block-grace", "2s", "--reuse-delay", "200ms"}

// startNodes starts n agents in cluster mode with datastore flags ds (which may
// override testTimings). Each one is
// stopped and its ledger file audited when the test ends (agentenv); the cluster audit
// runs before that, while they still answer.
// hostNetworkOff keeps agents that run in the host's namespace in cluster mode (the
// Kubernetes datastore's Nodes, the etcd datastore's node leases) from routing and
// masquerading there: the host's routes and netfilter rules are not the test's
// network (test/multinode and test/kubenodes test the node network, in namespaces
// of their own).
var hostNetworkOff = []string{"--routes=false", "--masquerade=false"}

func startNodes(t *testing.T, n int, ds []string) []*node {
	t.Helper()
	var nodes []*node
	for i := range n {
		name := fmt.Sprintf("node-%d", i)
		addr := netenv.FreeAddr(t)
		args := append(append([]string{"--node-name", name, "--metrics-addr", addr}, testTimings...), ds...) // ds may override a timing
		args = append(args, hostNetworkOff...)
		nodes = append(nodes, &node{name: name, metrics: addr, Agent: agentenv.Start(t, agentenv.Options{Args: args})})
	}
	// after the test, while the agents still answer (cleanups run last-in first-out):
	// the cluster audit over every node still running
	t.Cleanup(func() {
		if t.Failed() {
			return
		}
		var running []*node
		for _, n := range nodes {
			if n.PID() != 0 {
				running = append(running, n)
			}
		}
		if rep := clusterAudit(t, running); !rep.OK {
			t.Errorf("cluster audit at cleanup: %d double-assigned, problems %v", rep.DoubleAssigned, rep.Problems)
		}
	})
	return nodes
}

// clusterAudit runs the real `ipledgerctl cluster-audit -o json` over nodes and checks
// that its exit status matches its verdict.
func clusterAudit(t *testing.T, nodes []*node) ctl.ClusterAudit {
	t.Helper()
	args := []string{"cluster-audit", "-o", "json"}
	for _, n := range nodes {
		args = append(args, "--socket", n.Socket)
	}
	stdout, stderr, code := agentenv.Ctl(t, args...)
	var rep ctl.ClusterAudit
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("ipledgerctl cluster-audit exited %d, output not JSON: %v\n%s\n%s", code, err, stdout, stderr)
	}
	if (code == 0) != rep.OK || (code != 0 && code != 1) {
		t.Fatalf("ipledgerctl cluster-audit exited %d with ok=%v: %s", code, rep.OK, stderr)
	}
	t.Logf("cluster audit: ok=%v nodes=%d leases=%d blocks=%d doubles=%d lost=%d problems=%v", rep.OK, len(rep.Nodes), rep.Leases, rep.Blocks, rep.DoubleAssigned, rep.Lost, rep.Problems)
	return rep
}

// mustBalance fails the test unless the cluster audit finds no address held twice and
// every lease in its node's block.
func mustBalance(t *testing.T, nodes []*node) ctl.ClusterAudit {
	t.Helper()
	rep := clusterAudit(t, nodes)
	if !rep.OK || rep.DoubleAssigned != 0 {
		t.Fatalf("cluster audit failed: %d double-assigned, problems %v", rep.DoubleAssigned, rep.Problems)
	}
	return rep
}

// noFalseReclaim fails the test when any agent's log shows a block reclaimed from, or
// lost by, a node: every node was alive all along, only the datastore went away or
// an agent paused for a third of its lease. The tests' outages outlast the lease
// (every node's own lease lapses meanwhile), and that must still move no block, so
// a lapse is no excuse: the failure quotes the owner's own lapse line, when it has
// one, with its overdue= (a starved renewal loop against a slow datastore).
func noFalseReclaim(t *testing.T, nodes []*node) {
	t.Helper()
	lapsed := map[string]string{} // node: its first line saying its lease lapsed
	logs := map[*node][]string{}
	for _, n := range nodes {
		b, err := os.ReadFile(n.Log)
		if err != nil {
			t.Fatal(err)
		}
		logs[n] = strings.Split(string(b), "\n")
		for _, line := range logs[n] {
			if (strings.Contains(line, "node lease not proven in time") || strings.Contains(line, "node lease lost")) && lapsed[n.name] == "" {
				lapsed[n.name] = line
			}
		}
	}
	for _, n := range nodes {
		for _, line := range logs[n] {
			var owner string
			switch {
			case strings.Contains(line, "dead node's block reclaimed"):
				owner = logField(line, "owner")
			case strings.Contains(line, "msg=\"block lost\""):
				owner = n.name
			default:
				continue
			}
			why := "its log shows no lapse of its lease"
			if l := lapsed[owner]; l != "" {
				why = "its log: " + l
			}
			t.Errorf("%s: a live node's block (of %s) moved: %s\n\t%s: %s", n.name, owner, line, owner, why)
		}
	}
}

// logField is the value of key=value in a logfmt line ("" when absent).
func logField(line, key string) string {
	i := strings.Index(line, " "+key+"=")
	if i < 0 {
		return ""
	}
	v := line[i+len(key)+2:]
	if strings.HasPrefix(v, "\"") {
		if j := strings.Index(v[1:], "\""); j >= 0 {
			return v[1 : j+1]
		}
	}
	v, _, _ = strings.Cut(v, " ")
	return v
}

// blocksOf lists the datastore's blocks through a node's `ipledgerctl blocks -o json`.
func blocksOf(t *testing.T, n *node) []api.BlockView {
	t.Helper()
	stdout, stderr, code := agentenv.Ctl(t, "--socket", n.Socket, "blocks", "-o", "json")
	if code != 0 {
		t.Fatalf("ipledgerctl blocks: exit status %d: %s", code, stderr)
	}
	var bs []api.BlockView
	if err := json.Unmarshal([]byte(stdout), &bs); err != nil {
		t.Fatalf("ipledgerctl blocks: %v\n%s", err, stdout)
	}
	return bs
}

// ownedBy returns the blocks nodeName owns.
func ownedBy(bs []api.BlockView, nodeName string) []api.BlockView {
	var out []api.BlockView
	for _, b := range bs {
		if b.Owner == nodeName {
			out = append(out, b)
		}
	}
	return out
}

// holders is the test's own record of who holds each address right now: an address
// is entered when its ADD is answered and removed before its DEL is sent, so an ADD
// that answers an address still entered is a double assignment the cluster made.
type holders struct {
	mu      sync.Mutex
	m       map[netip.Addr]string
	doubles []string
}

func (h *holders) take(a netip.Addr, who string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if prev, ok := h.m[a]; ok {
		h.doubles = append(h.doubles, fmt.Sprintf("%s answered to %s while %s holds it", a, who, prev))
		return
	}
	h.m[a] = who
}

func (h *holders) drop(a netip.Addr) {
	h.mu.Lock()
	delete(h.m, a)
	h.mu.Unlock()
}

// churnOpts sizes a churn run.
type churnOpts struct {
	Allocations int // ADDs in all (each released again)
	Workers     int // concurrent workers per node
	Live        int // leases a worker keeps before it releases its oldest
	PluginEvery int // every Nth ADD/DEL goes through the plugin binary (0: none)
	// Retry is how long an ADD or DEL is retried while the agent answers that it
	// cannot serve now (the datastore is away and a block is needed) or cannot be
	// reached (killed and restarting).
	Retry time.Duration
	// Prefix makes the container IDs of one run distinct from another's.
	Prefix string
}

// churnStats counts what a churn run did; live is what it left allocated, by node.
type churnStats struct {
	adds, dels, viaPlugin, retries atomic.Int64
	mu                             sync.Mutex
	live                           map[*node][]attachment
	h                              *holders
	opts                           churnOpts
}

type attachment struct {
	cid string
	ips []netip.Addr
}

// churn runs opts.Allocations ADDs over nodes, concurrently, each worker releasing
// its oldest lease once it holds more than opts.Live, and calls during (if any) once
// a third of the ADDs are done. It leaves the last opts.Live leases of every worker
// allocated (releaseAll releases them), so that the cluster audit that follows sees
// a full cluster. Every ADD is checked against the test's holders record; the
// function fails the test on a double assignment or an operation that keeps failing.
func churn(t *testing.T, nodes []*node, opts churnOpts, during func()) *churnStats {
	t.Helper()
	h := &holders{m: map[netip.Addr]string{}}
	st := &churnStats{live: map[*node][]attachment{}, h: h, opts: opts}
	var plugin *pluginRunner
	if opts.PluginEvery > 0 {
		plugin = newPluginRunner(t)
	}
	sets := ranges(t)
	perWorker := opts.Allocations / (len(nodes) * opts.Workers)
	var started atomic.Int64
	trigger := int64(opts.Allocations / 3)
	var once sync.Once
	duringDone := make(chan struct{})
	if during == nil {
		close(duringDone)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, len(nodes)*opts.Workers)
	for ni, n := range nodes {
		for w := range opts.Workers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(ni), uint64(w)))
				var live []attachment
				release := func(a attachment) error {
					for _, ip := range a.ips {
						h.drop(ip)
					}
					usePlugin := plugin != nil && rng.IntN(opts.PluginEvery) == 0
					if err := retry(ctx, opts.Retry, st, func() error {
						if usePlugin {
							return plugin.del(n, a.cid)
						}
						_, err := n.Call(api.Request{Op: api.OpDel, Network: network, ContainerID: a.cid, IfName: "eth0"})
						return err
					}); err != nil {
						return fmt.Errorf("%s: DEL %s: %w", n.name, a.cid, err)
					}
					if usePlugin {
						st.viaPlugin.Add(1)
					}
					st.dels.Add(1)
					return nil
				}
				for i := range perWorker {
					if started.Add(1) == trigger && during != nil {
						once.Do(func() { go func() { defer close(duringDone); during() }() })
					}
					cid := fmt.Sprintf("%s%s-w%d-c%d", opts.Prefix, n.name, w, i)
					usePlugin := plugin != nil && rng.IntN(opts.PluginEvery) == 0
					var ips []netip.Addr
					err := retry(ctx, opts.Retry, st, func() error {
						var err error
						if usePlugin {
							ips, err = plugin.add(n, cid)
							return err
						}
						resp, err := n.Call(api.Request{Op: api.OpAdd, Network: network, ContainerID: cid, IfName: "eth0", Ranges: sets})
						if err != nil {
							return err
						}
						ips = ips[:0]
						for _, s := range resp.Lease.IPs {
							p, perr := netip.ParsePrefix(s)
							if perr != nil {
								return perr
							}
							ips = append(ips, p.Addr())
						}
						return nil
					})
					if err != nil {
						errs <- fmt.Errorf("%s: ADD %s: %w", n.name, cid, err)
						return
					}
					if usePlugin {
						st.viaPlugin.Add(1)
					}
					st.adds.Add(1)
					for _, ip := range ips {
						h.take(ip, n.name+"/"+cid)
					}
					live = append(live, attachment{cid, ips})
					if len(live) > opts.Live {
						if err := release(live[0]); err != nil {
							errs <- err
							return
						}
						live = live[1:]
					}
				}
				st.mu.Lock()
				st.live[n] = append(st.live[n], live...)
				st.mu.Unlock()
			})
		}
	}
	wg.Wait()
	<-duringDone
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, d := range h.doubles {
		t.Errorf("double assignment: %s", d)
	}
	t.Logf("churn: %d ADDs, %d DELs (%d through the plugin binary), %d retries", st.adds.Load(), st.dels.Load(), st.viaPlugin.Load(), st.retries.Load())
	if t.Failed() {
		t.FailNow()
	}
	return st
}

// releaseAll releases every lease churn left allocated, concurrently per node.
func (st *churnStats) releaseAll(t *testing.T) {
	t.Helper()
	var wg sync.WaitGroup
	for n, live := range st.live {
		wg.Go(func() {
			for _, a := range live {
				for _, ip := range a.ips {
					st.h.drop(ip)
				}
				if err := retry(context.Background(), st.opts.Retry, st, func() error {
					_, err := n.Call(api.Request{Op: api.OpDel, Network: network, ContainerID: a.cid, IfName: "eth0"})
					return err
				}); err != nil {
					t.Errorf("%s: DEL %s: %v", n.name, a.cid, err)
					return
				}
				st.dels.Add(1)
			}
		})
	}
	wg.Wait()
	st.live = map[*node][]attachment{}
}

// sideBySideWhenShort runs the test beside the package's other etcd tests
// under -short (go test -short ./...): each is bound by its lease, quarantine
// and fault timers, each has its own etcd, agents and state, so side by side
// the package takes about as long as its longest test, not their sum. make
// test runs them one after the other, at full size.
func sideBySideWhenShort(t *testing.T) {
	if testing.Short() {
		t.Parallel()
	}
}

// call sends req to n, retrying while the agent answers that it cannot serve now
// (CodeUnavailable: a datastore call timed out on the loaded test machine, or the
// lease is being renewed), as a runtime retries an ADD that failed with "try again
// later"; at most 30s.
func call(n *node, req api.Request) (*api.Response, error) {
	var resp *api.Response
	err := retry(context.Background(), 30*time.Second, &churnStats{}, func() error {
		var err error
		resp, err = n.Call(req)
		return err
	})
	return resp, err
}

// retry runs op until it succeeds, fails with an error other than "unavailable"
// (the agent cannot serve now) or an unreachable agent, or budget has passed.
func retry(ctx context.Context, budget time.Duration, st *churnStats, op func() error) error {
	deadline := time.Now().Add(budget)
	for {
		err := op()
		if err == nil {
			return nil
		}
		var ae *api.Error
		transient := errors.As(err, &ae) && ae.Code == api.CodeUnavailable
		transient = transient || errors.Is(err, errPluginTryAgain)
		// a killed agent: every verb is idempotent, so the same request is sent
		// again once it is back (an ADD gets the lease it may have made)
		transient = transient || errors.Is(err, api.ErrUnreachable) || errors.Is(err, api.ErrNoAnswer)
		if !transient || time.Now().After(deadline) {
			return err
		}
		st.retries.Add(1)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// pluginRunner execs the real ipledger IPAM plugin as a runtime does, in a network
// namespace of its own.
type pluginRunner struct {
	t         *testing.T
	path      string
	ns        string
	blockSize int // the ipam config's blockSize (0: left out)
}

var errPluginTryAgain = errors.New("plugin: try again later")

func newPluginRunner(t *testing.T) *pluginRunner {
	t.Helper()
	return &pluginRunner{t: t, path: filepath.Join(agentenv.Bin(t), "ipledger"), ns: netenv.Namespace(t, "iplcl").Path}
}

func (p *pluginRunner) exec(n *node, verb, cid string) ([]byte, error) {
	ipam := n.IPAM(rangesJSON)
	if p.blockSize != 0 {
		ipam = strings.TrimSuffix(ipam, "}") + fmt.Sprintf(`,"blockSize":%d}`, p.blockSize)
	}
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"ipledger","ipam":%s}`, network, ipam)
	cmd := exec.Command(p.path)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND=" + verb, "CNI_CONTAINERID=" + cid,
		"CNI_NETNS=" + p.ns, "CNI_IFNAME=eth0", "CNI_PATH=" + filepath.Dir(p.path)}
	cmd.Stdin = strings.NewReader(conf)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		var ce struct {
			Code uint   `json:"code"`
			Msg  string `json:"msg"`
		}
		json.Unmarshal(stdout.Bytes(), &ce)
		if ce.Code == 11 { // CNI "try again later"
			return nil, fmt.Errorf("%w: %s", errPluginTryAgain, ce.Msg)
		}
		if ce.Code != 0 {
			return nil, &cniError{Code: ce.Code, Msg: ce.Msg}
		}
		return nil, fmt.Errorf("ipledger %s %s: %v: %s %s", verb, cid, err, stdout.String(), stderr.String())
	}
	return stdout.Bytes(), nil
}

// cniError is a CNI error the plugin printed.
type cniError struct {
	Code uint
	Msg  string
}

func (e *cniError) Error() string { return fmt.Sprintf("CNI error %d: %s", e.Code, e.Msg) }

func (p *pluginRunner) add(n *node, cid string) ([]netip.Addr, error) {
	out, err := p.exec(n, "ADD", cid)
	if err != nil {
		return nil, err
	}
	var res struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, fmt.Errorf("ADD result: %v: %s", err, out)
	}
	var ips []netip.Addr
	for _, ip := range res.IPs {
		pr, err := netip.ParsePrefix(ip.Address)
		if err != nil {
			return nil, err
		}
		ips = append(ips, pr.Addr())
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("ADD result without addresses: %s", out)
	}
	return ips, nil
}

func (p *pluginRunner) del(n *node, cid string) error {
	_, err := p.exec(n, "DEL", cid)
	return err
}
