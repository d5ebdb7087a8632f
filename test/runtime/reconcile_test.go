package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/reconcile"
	"github.com/ipledger/ipledger/internal/store/memstore"
	"github.com/ipledger/ipledger/internal/testenv/containerdenv"
)

// faultyRuntime is a real containerd's CRI client with two things of a busy node
// made to happen on cue: SandboxStatus fails for one sandbox (failFor), and after
// a listing has been taken, before it is returned, onListed runs (a pod starting
// while the reconciler works).
type faultyRuntime struct {
	*cri.Client
	failFor  string
	onListed func()
}

var _ reconcile.Runtime = (*faultyRuntime)(nil)

func (f *faultyRuntime) ListSandboxes(ctx context.Context) ([]cri.Sandbox, error) {
	sbs, err := f.Client.ListSandboxes(ctx)
	if err == nil && f.onListed != nil {
		f.onListed()
	}
	return sbs, err
}

func (f *faultyRuntime) SandboxStatus(ctx context.Context, id string) (cri.Sandbox, error) {
	if id == f.failFor {
		return cri.Sandbox{}, errors.New("injected: rpc error: code = Unknown desc = failed to get sandbox status")
	}
	return f.Client.SandboxStatus(ctx, id)
}

type tlog struct{ t *testing.T }

func (w tlog) Write(p []byte) (int, error) { w.t.Log(strings.TrimSpace(string(p))); return len(p), nil }

// TestReconcileLivenessRealContainerd: against a real containerd, one sandbox whose
// status keeps failing and pods started between every listing and its status
// calls do not stop the reconciler: a removed pod's lease is released within grace
// plus one interval of the removal (invariant 3), while every READY pod's lease is
// kept (invariant 2) and so is the lease of the sandbox whose status fails (no
// evidence, invariant 4).
func TestReconcileLivenessRealContainerd(t *testing.T) {
	const bridge, subnet = "iplrecliv0", "10.244.252.0/24"
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "link", "del", bridge).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find device") {
			t.Logf("ip link del %s: %v: %s", bridge, err, out)
		}
	})
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"livenet","plugins":[{"type":"bridge","bridge":%q,"isGateway":false,"ipMasq":false,"ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],"dataDir":%q}}]}`,
		bridge, subnet, t.TempDir())
	env := containerdenv.Start(t, containerdenv.Options{Conflist: conf})
	c := env.Client(t)
	ctx := context.Background()

	l, err := ledger.Open(memstore.New(), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	sets := mustRanges(t, "10.246.7.0/24") // the ledger's own pool; the pods' addresses come from the bridge
	var mu sync.Mutex
	ids := map[string]string{}
	run := func(name string) {
		id, err := c.RunPodSandbox(ctx, cri.PodSpec{Namespace: "liveness", Name: name, UID: "uid-" + name})
		if err != nil {
			t.Fatalf("run %s: %v", name, err)
		}
		st, err := c.SandboxStatus(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		ns := ledger.NetNS{Path: st.NetNSPath}
		var fi syscall.Stat_t
		if err := syscall.Stat(st.NetNSPath, &fi); err != nil {
			t.Fatalf("netns of %s: %v", name, err)
		}
		ns.Dev, ns.Ino = fi.Dev, fi.Ino
		if _, _, err := l.Allocate(ledger.AllocateRequest{Key: ledger.Key{Network: "livenet", ContainerID: id, IfName: "eth0"}, Pod: ledger.Pod{Namespace: "liveness", Name: name, UID: "uid-" + name}, NetNS: ns, Ranges: sets}); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		ids[name] = id
		mu.Unlock()
	}
	held := func(name string) bool {
		mu.Lock()
		defer mu.Unlock()
		_, ok := l.Lease(ledger.Key{Network: "livenet", ContainerID: ids[name], IfName: "eth0"})
		return ok
	}
	for _, n := range []string{"keep", "gone", "broken"} {
		run(n)
	}
	started := 0
	rt := &faultyRuntime{Client: c, failFor: ids["broken"], onListed: func() {
		if started < 3 { // a pod starts while the reconciler works
			started++
			run(fmt.Sprintf("late-%d", started))
		}
	}}
	clk := clocktest.New()
	rec, err := reconcile.New(reconcile.Options{Ledger: l, Runtime: rt, Netns: reconcile.NSFS{}, Interval: interval, Grace: grace, Clock: clk,
		Logger: slog.New(slog.NewTextHandler(tlog{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	rec.Reconcile(ctx) // first sight of every lease
	clk.Advance(grace)
	// Both pods are removed; only "gone" can be proven so: SandboxStatus of
	// "broken" fails every time (it is asked because it is no longer listed).
	for _, n := range []string{"gone", "broken"} {
		if err := c.StopPodSandbox(ctx, ids[n]); err != nil {
			t.Fatal(err)
		}
		if err := c.RemovePodSandbox(ctx, ids[n]); err != nil {
			t.Fatal(err)
		}
	}
	start := clk.Mono()
	for held("gone") {
		if took := clk.Mono() - start; took > grace+interval {
			t.Fatalf("removed pod's lease not released %v after the removal; want within grace+interval %v (last round %+v)", took, grace+interval, rec.Last())
		}
		clk.Advance(interval)
		if rd := rec.Reconcile(ctx); rd.Err != nil || rd.Doubtful {
			t.Fatalf("round %+v: want answered and not doubtful", rd)
		}
	}
	t.Logf("MEASURED liveness: removed pod's lease released %v (reconciler clock) after the removal; %d pods started between listing and status", clk.Mono()-start, started)
	mu.Lock()
	names := make([]string, 0, len(ids))
	for n := range ids {
		names = append(names, n)
	}
	mu.Unlock()
	for _, n := range names {
		if n != "gone" && !held(n) {
			t.Fatalf("lease of %s released (its sandbox is READY, or its status fails)", n)
		}
	}
	if started == 0 {
		t.Fatal("no pod started between a listing and its status calls: the test exercised nothing")
	}
	if rd := rec.Last(); rd.Unknown != 1 {
		t.Fatalf("last round %+v: want exactly the failing sandbox's lease without evidence", rd)
	}
}
