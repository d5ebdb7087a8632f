package bench

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/reconcile"
	"github.com/ipledger/ipledger/internal/store/memstore"
	"github.com/ipledger/ipledger/internal/testenv/containerdenv"
)

const (
	subnetReconcile = "10.245.0.0/16"
	subnetCtd       = "10.247.24.0/22"
	reconcileNet    = "bench-reconcile"
	ctdNet          = "bench-ctd"
	reconcilePasses = 5
)

// reconcileCPUName is the row the reconcile goal refers to (full run: 10k).
func reconcileCPUName(n int) string {
	return fmt.Sprintf("reconcile pass, %s leases vs %s sandboxes, all READY (fake lister)", kilo(n), kilo(n))
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pass runs fresh reconcilers over rt and returns the median CPU and wall time of
// one round.
//
// Each timed round is a reconciler's second: its first (untimed) round sees the
// leases for the first time with every sandbox READY (warm), which neither suspects
// nor releases anything; the clock then moves past the grace and the runtime
// answers as rt does, so the timed round is that of a reconciler that has run for a
// while, and every pass sees the same ledger.
func pass(newRec func(clock.Clock, reconcile.Runtime) (*reconcile.Reconciler, error), warm, rt reconcile.Runtime) (cpu, wall float64, rd reconcile.Round, err error) {
	var cpus, walls dist
	for i := 0; i < reconcilePasses; i++ {
		clk := clocktest.New()
		ph := &phased{Runtime: warm}
		r, err := newRec(clk, ph)
		if err != nil {
			return 0, 0, rd, err
		}
		if rd = r.Reconcile(context.Background()); rd.Err != nil || rd.Suspect != 0 || len(rd.Released) != 0 {
			return 0, 0, rd, fmt.Errorf("reconcile warm-up round: %d suspects, %d released, err %v", rd.Suspect, len(rd.Released), rd.Err)
		}
		clk.Advance(2 * time.Hour) // every lease is past the grace
		ph.Runtime = rt
		runtime.GC()
		c0, t0 := cpuTime(), time.Now()
		rd = r.Reconcile(context.Background())
		walls = append(walls, time.Since(t0))
		cpus = append(cpus, cpuTime()-c0)
		if rd.Err != nil {
			return 0, 0, rd, rd.Err
		}
	}
	return cpus.p50(), walls.p50(), rd, nil
}

// phased is a Runtime whose answers the harness switches between rounds (never
// during one).
type phased struct{ reconcile.Runtime }

// fakeRuntime lists a fixed set of sandboxes; SandboxStatus answers NotFound for the
// others.
type fakeRuntime struct {
	list []cri.Sandbox
	byID map[string]cri.Sandbox
}

var _ reconcile.Runtime = (*fakeRuntime)(nil)

func (f *fakeRuntime) ListSandboxes(context.Context) ([]cri.Sandbox, error) {
	return append([]cri.Sandbox(nil), f.list...), nil
}

func (f *fakeRuntime) SandboxStatus(_ context.Context, id string) (cri.Sandbox, error) {
	if s, ok := f.byID[id]; ok {
		return s, nil
	}
	return cri.Sandbox{}, fmt.Errorf("%w: %s", cri.ErrNotFound, id)
}

// fakeNetns says every probed namespace is gone.
type fakeNetns struct{}

var _ reconcile.Netns = fakeNetns{}

func (fakeNetns) Probe(ledger.NetNS, []netip.Prefix) (reconcile.NSState, string) {
	return reconcile.NSGone, "fake: gone"
}
func (fakeNetns) Reclaim(ledger.NetNS, string, []netip.Prefix) (string, error) {
	return "", nil
}

// memLedger returns an in-memory ledger holding a lease for every key.
func memLedger(network, subnet string, keys []string, netns func(i int) ledger.NetNS) (*ledger.Ledger, error) {
	sets, err := pool.ParseRangeSets([]byte(rangesJSON(subnet)))
	if err != nil {
		return nil, err
	}
	l, err := ledger.Open(memstore.New(), ledger.Options{})
	if err != nil {
		return nil, err
	}
	for i, id := range keys {
		pod := ledger.Pod{Namespace: "bench", Name: fmt.Sprint("pod-", i), UID: fmt.Sprint("uid-", id)}
		if _, _, err := l.Allocate(ledger.AllocateRequest{Key: ledger.Key{Network: network, ContainerID: id, IfName: "eth0"}, Pod: pod, NetNS: netns(i), Ranges: sets}); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// reconcile measures one reconciliation round: over 10,000 leases against a fake
// lister (all READY, then with 10% of the sandboxes NOTREADY or gone), and over the
// sandboxes of a real containerd running pods set up by ipledger-veth + ipledger.
func (h *harness) reconcile() error {
	n := h.opts.ReconcileLeases
	ids := make([]string, n)
	sbs := make([]cri.Sandbox, n)
	created := time.Now().Add(-time.Hour)
	for i := range ids {
		ids[i] = fmt.Sprintf("%064x", i+1)
		sbs[i] = cri.Sandbox{ID: ids[i], State: cri.StateReady, Namespace: "bench", Name: fmt.Sprint("pod-", i), UID: fmt.Sprint("uid-", ids[i]), CreatedAt: created}
	}
	l, err := memLedger(reconcileNet, subnetReconcile, ids, func(i int) ledger.NetNS {
		return ledger.NetNS{Path: fmt.Sprintf("/var/run/netns/cni-%d", i), Dev: 4, Ino: uint64(4026532000 + i)}
	})
	if err != nil {
		return err
	}
	newRec := func(clk clock.Clock, rt reconcile.Runtime) (*reconcile.Reconciler, error) {
		return reconcile.New(reconcile.Options{Ledger: l, Runtime: rt, Netns: fakeNetns{}, Interval: time.Minute, Grace: time.Minute, Clock: clk})
	}
	all := &fakeRuntime{list: sbs, byID: map[string]cri.Sandbox{}}
	for _, s := range sbs {
		all.byID[s.ID] = s
	}
	cpu, wall, _, err := pass(newRec, all, all)
	if err != nil {
		return err
	}
	h.row(groupLedger, reconcileCPUName(n)+", CPU", "ms", cpu, nan, nan)
	h.row(groupLedger, reconcileCPUName(n)+", wall", "ms", wall, nan, nan)
	// 5% NOTREADY (netns probed), 5% missing from the listing (SandboxStatus NotFound)
	mixed := &fakeRuntime{byID: map[string]cri.Sandbox{}}
	for i, s := range sbs {
		switch i % 20 {
		case 0:
			continue
		case 1:
			s.State = cri.StateNotReady
		}
		mixed.list = append(mixed.list, s)
		mixed.byID[s.ID] = s
	}
	cpu, wall, rd, err := pass(newRec, all, mixed)
	if err != nil {
		return err
	}
	if rd.Suspect != n/10 {
		return fmt.Errorf("mixed reconcile round: %d suspects, want %d", rd.Suspect, n/10)
	}
	mixedName := fmt.Sprintf("reconcile pass, %s leases, 5%% NOTREADY + 5%% gone (fake lister and netns)", kilo(n))
	h.row(groupLedger, mixedName+", CPU", "ms", cpu, nan, nan)
	h.row(groupLedger, mixedName+", wall", "ms", wall, nan, nan)
	return h.reconcileContainerd()
}

// reconcileContainerd runs pods in a private containerd whose CNI network is
// ipledger-veth + ipledger, then times reconciliation rounds (real CRI, real netns
// probes) over an in-memory ledger holding their leases.
func (h *harness) reconcileContainerd() error {
	pods := h.opts.ContainerdPods
	conflist := fmt.Sprintf(`{"cniVersion":%q,"name":%q,"plugins":[{"type":"ipledger-veth","ipam":%s}]}`, cniVersion, ctdNet, h.agent.IPAM(rangesJSON(subnetCtd)))
	t0 := time.Now()
	env := containerdenv.Start(h.tb, containerdenv.Options{Conflist: conflist, CNIBinDirs: []string{h.cniPath}})
	h.log.Info("bench: containerd ready", "took", time.Since(t0).Round(time.Millisecond))
	c := env.Client(h.tb)
	ctx := h.ctx
	ids := make([]string, pods)
	t0 = time.Now()
	err := parallel(pods, 4, func(i int) (err error) {
		ids[i], err = c.RunPodSandbox(ctx, cri.PodSpec{Namespace: "bench", Name: fmt.Sprintf("pod-%03d", i), UID: fmt.Sprintf("bench-uid-%03d", i),
			LogDir: filepath.Join(h.work, "pod-logs", fmt.Sprint(i))})
		return err
	})
	// remove our pods in parallel (containerdenv's cleanup would do it one by one)
	defer func() {
		parallel(pods, 4, func(i int) error {
			if ids[i] != "" {
				c.StopPodSandbox(context.Background(), ids[i])
				c.RemovePodSandbox(context.Background(), ids[i])
			}
			return nil
		})
	}()
	if err != nil {
		return fmt.Errorf("running %d pods: %w", pods, err)
	}
	h.log.Info("bench: pods running", "pods", pods, "took", time.Since(t0).Round(time.Millisecond))
	nss := make([]ledger.NetNS, pods)
	for i, id := range ids {
		st, err := c.SandboxStatus(ctx, id)
		if err != nil {
			return err
		}
		ns := ledger.NetNS{Path: st.NetNSPath}
		var fi syscall.Stat_t
		if syscall.Stat(st.NetNSPath, &fi) == nil {
			ns.Dev, ns.Ino = fi.Dev, fi.Ino
		}
		nss[i] = ns
	}
	l, err := memLedger(ctdNet, subnetCtd, ids, func(i int) ledger.NetNS { return nss[i] })
	if err != nil {
		return err
	}
	cpu, wall, rd, err := pass(func(clk clock.Clock, rt reconcile.Runtime) (*reconcile.Reconciler, error) {
		return reconcile.New(reconcile.Options{Ledger: l, Runtime: rt, Netns: reconcile.NSFS{}, Interval: time.Minute, Grace: time.Minute, Clock: clk})
	}, c, c)
	if err != nil {
		return err
	}
	if rd.Doubtful || rd.Suspect != 0 || len(rd.Released) != 0 {
		return fmt.Errorf("reconcile over containerd's running pods: doubtful %v (%s), %d suspects, %d released; want a clean round", rd.Doubtful, rd.Why, rd.Suspect, len(rd.Released))
	}
	what := fmt.Sprintf("a real containerd's %d READY pods (CRI)", pods)
	h.row(groupLedger, fmt.Sprintf("reconcile pass, %s, CPU of the agent side", what), "ms", cpu, nan, nan)
	h.row(groupLedger, fmt.Sprintf("reconcile pass, %s, wall", what), "ms", wall, nan, nan)
	h.note("Reconcile rows: CPU is the harness process's user+system time (getrusage) for one round of a fresh reconciler (median of %d), run in-process on an in-memory ledger; the containerd rows' pods were set up by containerd through ipledger-veth + ipledger, and their CPU excludes containerd's own.", reconcilePasses)
	return nil
}
