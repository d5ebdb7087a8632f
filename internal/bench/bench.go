// Package bench is ipledger's benchmark harness: in one run it measures the exec floor
// (a no-op static Go binary), the ipledger IPAM plugin against Debian's host-local at
// several pool fills, bursts of concurrent ADDs, the routed-veth plugin against ptp in
// real network namespaces, and the agent and ledger in-process; it reports a Markdown
// table of the numbers and their ratios, so comparisons hold on a noisy machine.
//
// Run needs root, iproute2, Debian's CNI plugins in /usr/lib/cni and a Go toolchain
// (the binaries and the floor are built from this source tree). It creates network
// namespaces and veths only for pools in 10.247.0.0/16 and 10.249.0.0/16, stops what it
// starts by PID and removes everything it made.
package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/nsenter"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/containerdenv"
	"github.com/ipledger/ipledger/internal/testenv/debpkg"
)

// DefaultCNIBinDir holds Debian's containernetworking-plugins (host-local, ptp).
const DefaultCNIBinDir = "/usr/lib/cni"

// KubeletMaxPods is kubelet's default max pods per node: the size of a burst.
const KubeletMaxPods = 110

// Options configures a run. The zero value is the full benchmark.
type Options struct {
	// Smoke runs small counts (a few seconds): for CI, so the harness never rots.
	Smoke bool
	// BinDir holds the ipledger and ipledger-veth binaries to measure (e.g. bin/ of
	// `make build`). Empty: the binaries agentenv builds from this source tree.
	// ipledgerd is always agentenv's build.
	BinDir string
	// CNIBinDir holds host-local and ptp; default DefaultCNIBinDir.
	CNIBinDir string
	// TB, when set (a test), receives cleanups and failures; otherwise Run keeps its
	// own and undoes everything before it returns.
	TB testing.TB
	// Log receives progress; default discards.
	Log *slog.Logger

	// Counts; zero takes the mode's default.
	Samples      int // exec latency samples per plugin, verb and fill
	BurstSize    int // concurrent ADDs per burst (default KubeletMaxPods)
	BurstReps    int // bursts per system; the median is reported
	VethSamples  int // sequential pods per main plugin
	VethReps     int // main-plugin bursts per system
	LedgerLeases int // live leases for the in-process ledger rate
	AgentLeases  int // live leases in the agent for its RSS
	// ReconcileLeases are the leases and sandboxes of the fake-lister reconcile rows.
	ReconcileLeases int
	// ContainerdPods run in a private containerd for the reconcile row.
	ContainerdPods int
	LedgerTime     time.Duration
	// Steps, when not empty, runs only the named steps (binaries, ipam-latency,
	// ipam-burst, main-plugin, ledger, agent-rss, reconcile): for measuring one
	// change quickly. The goals are evaluated on the rows measured.
	Steps []string
	// PoolBits is the prefix length of the IPAM pools (default 22; smoke 26, so that
	// filling host-local's pool by exec stays short).
	PoolBits int
}

func (o Options) withDefaults() Options {
	def := func(v *int, full, smoke int) {
		if *v <= 0 {
			*v = full
			if o.Smoke {
				*v = smoke
			}
		}
	}
	def(&o.Samples, 300, 8)
	def(&o.BurstSize, KubeletMaxPods, 12)
	def(&o.BurstReps, 7, 1)
	def(&o.VethSamples, 100, 3)
	def(&o.VethReps, 3, 1)
	def(&o.PoolBits, 22, 26)
	def(&o.LedgerLeases, 64000, 1000)
	def(&o.AgentLeases, 64000, 1000)
	def(&o.ContainerdPods, 200, 3)
	def(&o.ReconcileLeases, 10000, 1000)
	if o.LedgerTime <= 0 {
		o.LedgerTime = 5 * time.Second
		if o.Smoke {
			o.LedgerTime = 300 * time.Millisecond
		}
	}
	if o.CNIBinDir == "" {
		o.CNIBinDir = DefaultCNIBinDir
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return o
}

// Run runs the benchmark and returns its report. Without opts.TB, a failure ends the
// run with an error after everything started has been undone.
func Run(ctx context.Context, opts Options) (rep Report, err error) {
	opts = opts.withDefaults()
	tb := opts.TB
	if tb == nil {
		r := newRunner(opts.Log)
		tb = r
		defer func() {
			p := recover()
			r.cleanup()
			if p != nil {
				if _, ok := p.(fatalRun); !ok {
					panic(p)
				}
			}
			if rerr := r.err(); rerr != nil {
				err = rerr
			}
		}()
	}
	if len(opts.Steps) == 0 || slices.Contains(opts.Steps, "reconcile") {
		// the reconcile step's containerd skips a test under -short: skip before
		// the steps that come first, not after them
		containerdenv.SkipIfShort(tb)
	}
	h := &harness{ctx: ctx, tb: tb, opts: opts, log: opts.Log}
	h.rep.Machine = machineInfo(opts)
	start := time.Now()
	if err := h.setup(); err != nil {
		return h.rep, err
	}
	for _, step := range []struct {
		name string
		run  func() error
	}{
		{"binaries", h.binaries},
		{"ipam-latency", h.ipamLatency},
		{"ipam-burst", h.ipamBurst},
		{"main-plugin", h.mainPlugin},
		{"ledger", h.ledgerRate},
		{"agent-rss", h.agentRSS},
		{"reconcile", h.reconcile},
	} {
		if err := ctx.Err(); err != nil {
			return h.rep, err
		}
		if len(opts.Steps) > 0 && !slices.Contains(opts.Steps, step.name) {
			continue
		}
		h.log.Info("bench: " + step.name)
		t0 := time.Now()
		if err := step.run(); err != nil {
			return h.rep, fmt.Errorf("%s: %w", step.name, err)
		}
		h.log.Info("bench: "+step.name+" done", "took", time.Since(t0).Round(time.Millisecond))
	}
	h.rep.Duration = time.Since(start)
	h.rep.Targets = targets(&h.rep, h.opts)
	return h.rep, nil
}

// harness is one run.
type harness struct {
	ctx  context.Context
	tb   testing.TB
	opts Options
	log  *slog.Logger
	rep  Report

	work    string // temp dir
	cniPath string // CNI_PATH: ipledger, ipledger-veth, host-local, ptp, noop
	agent   *agentenv.Agent
	nsSeq   atomic.Int64
	nsMu    sync.Mutex
	ns      map[string]bool // named netns we created and not yet deleted
}

func (h *harness) bin(name string) string { return filepath.Join(h.cniPath, name) }

// setup builds the floor, assembles CNI_PATH and starts the agent.
func (h *harness) setup() error {
	work, err := os.MkdirTemp("", "ipledger-bench-")
	if err != nil {
		return err
	}
	h.tb.Cleanup(func() { os.RemoveAll(work) })
	h.work = work
	h.ns = map[string]bool{}
	h.tb.Cleanup(h.deleteAllNetNS)
	// iproute2 and Debian's CNI plugins (the baseline), installed if missing, under
	// the lock every test process takes: another package's test may be installing
	// them right now.
	pkgs := []debpkg.Package{debpkg.IPRoute2}
	if h.opts.CNIBinDir == DefaultCNIBinDir {
		pkgs = append(pkgs, debpkg.CNIPlugins)
	}
	if err := debpkg.Ensure(pkgs...); err != nil {
		return err
	}
	h.cniPath = filepath.Join(work, "cni")
	if err := os.Mkdir(h.cniPath, 0o755); err != nil {
		return err
	}
	binDir := h.opts.BinDir
	if binDir == "" {
		binDir = agentenv.Bin(h.tb)
	}
	if binDir, err = filepath.Abs(binDir); err != nil {
		return err
	}
	h.rep.Machine.BinDir = binDir
	links := map[string]string{
		"ipledger":      filepath.Join(binDir, "ipledger"),
		"ipledger-veth": filepath.Join(binDir, "ipledger-veth"),
		"host-local":    filepath.Join(h.opts.CNIBinDir, "host-local"),
		"ptp":           filepath.Join(h.opts.CNIBinDir, "ptp"),
	}
	for name, target := range links {
		if _, err := os.Stat(target); err != nil {
			return fmt.Errorf("plugin %s: %w", name, err)
		}
		if err := os.Symlink(target, filepath.Join(h.cniPath, name)); err != nil {
			return err
		}
	}
	if err := buildFloor(filepath.Join(h.cniPath, "noop")); err != nil {
		return err
	}
	h.agent = agentenv.Start(h.tb, agentenv.Options{Args: []string{"--reuse-delay", "0s", "--log-level", "info"}})
	return nil
}

// buildFloor builds the floor: a static Go binary whose main does nothing.
func buildFloor(out string) error {
	dir, err := os.MkdirTemp("", "ipledger-noop-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	files := map[string]string{
		"go.mod":  "module noop\n\ngo 1.22\n",
		"main.go": "// Command noop does nothing: the floor of exec'ing a Go binary.\npackage main\n\nfunc main() {}\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the no-op floor binary: %v\n%s", err, b)
	}
	return nil
}

// call is one plugin exec as a runtime does it: CNI_* in the environment, the
// network configuration on stdin.
type call struct {
	plugin, command, containerID, netns, ifname string
	conf                                        []byte
	// node is the network namespace the plugin runs in, as a node's runtime
	// runs it (its host side: veths, routes, sysctls); nil is the caller's.
	node *os.File
}

// exec runs c and returns its wall time (fork to reaped) and stdout.
func (h *harness) exec(c call) (time.Duration, []byte, error) {
	cmd := exec.Command(h.bin(c.plugin))
	ifname := c.ifname
	if ifname == "" {
		ifname = "eth0"
	}
	cmd.Env = []string{"CNI_COMMAND=" + c.command, "CNI_CONTAINERID=" + c.containerID, "CNI_NETNS=" + c.netns,
		"CNI_IFNAME=" + ifname, "CNI_PATH=" + h.cniPath, "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdin = bytes.NewReader(c.conf)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	var d time.Duration
	run := func() error {
		start := time.Now()
		err := cmd.Run()
		d = time.Since(start)
		return err
	}
	var err error
	if c.node != nil {
		// the child is forked from the thread Do moved into the node namespace
		err = nsenter.Do(int(c.node.Fd()), run)
	} else {
		err = run()
	}
	if err != nil {
		return d, out.Bytes(), fmt.Errorf("%s %s %s: %v; stdout %s; stderr %s", c.plugin, c.command, c.containerID, err, bytes.TrimSpace(out.Bytes()), bytes.TrimSpace(errb.Bytes()))
	}
	return d, out.Bytes(), nil
}

// floor execs the no-op binary once.
func (h *harness) floor(node *os.File) (time.Duration, error) {
	d, _, err := h.exec(call{plugin: "noop", command: "ADD", containerID: "floor", conf: []byte("{}"), node: node})
	return d, err
}

// burst runs n calls at once (released together) and returns the wall time until the
// last has answered.
func burst(n int, f func(i int) error) (time.Duration, error) {
	var wg, ready sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	ready.Add(n)
	for i := 0; i < n; i++ {
		wg.Go(func() {
			ready.Done()
			<-start
			errs[i] = f(i)
		})
	}
	ready.Wait()
	t0 := time.Now()
	close(start)
	wg.Wait()
	return time.Since(t0), errors.Join(errs...)
}

// parallel runs f(0..n-1) on w workers and returns the first error.
func parallel(n, w int, f func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for j := 0; j < w; j++ {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					next.Store(int64(n))
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// newNetNS creates a named network namespace and returns its path.
func (h *harness) newNetNS(tag string) (string, error) {
	name := fmt.Sprintf("iplb-%d-%s%d", os.Getpid()%100000, tag, h.nsSeq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return "", fmt.Errorf("ip netns add %s: %v %s", name, err, out)
	}
	h.nsMu.Lock()
	h.ns[name] = true
	h.nsMu.Unlock()
	return "/run/netns/" + name, nil
}

// delNetNS deletes a namespace newNetNS made (and with it the links inside).
func (h *harness) delNetNS(path string) error {
	name := filepath.Base(path)
	h.nsMu.Lock()
	ours := h.ns[name]
	delete(h.ns, name)
	h.nsMu.Unlock()
	if !ours {
		return fmt.Errorf("netns %s was not made by this run", path)
	}
	if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns del %s: %v %s", name, err, out)
	}
	return nil
}

func (h *harness) deleteAllNetNS() {
	h.nsMu.Lock()
	var left []string
	for name := range h.ns {
		left = append(left, "/run/netns/"+name)
	}
	h.nsMu.Unlock()
	for _, p := range left {
		if err := h.delNetNS(p); err != nil {
			h.tb.Errorf("cleanup: %v", err)
		}
	}
}
