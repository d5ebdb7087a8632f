// Command demo is `make demo`: on this machine (as root) it starts a private
// containerd and ipledgerd on its embedded store, runs a few hundred real pod
// sandboxes through ipledger-veth + ipledger while injecting the seed faults, runs
// the same churn and faults against bridge + host-local, prints both ledgers' books
// side by side and a short `ipledgerctl sim` table. It uses the test environment
// (internal/testenv), so it is a source-tree command (`go run ./test/demo`), never
// an installed binary.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/containerdenv"
)

// Options size a demo run.
type Options struct {
	// Churn is the number of ordinary run/stop/remove cycles per system, in two
	// halves around the injected faults; Faulty is how many sandboxes each fault
	// touches.
	Churn, Faulty int
	// Out receives the report; Progress, when set, a live progress line.
	Out      io.Writer
	Progress io.Writer
}

// Books are one system's books at the end.
type Books struct {
	System    string
	Sandboxes int // sandboxes run
	Errors    int // RunPodSandbox/Stop/Remove errors met (retried)
	Held      int // addresses the IPAM still holds
	LiveAtEnd int // sandboxes left in the runtime
	Faults    []string
	AuditOK   bool // ipledger only: its audit balanced
}

// Leaked is what the IPAM holds for no sandbox.
func (b Books) Leaked() int { return b.Held - b.LiveAtEnd }

const failerScript = `#!/bin/sh
cat >/dev/null
if [ "$CNI_COMMAND" = VERSION ]; then echo '{"cniVersion":"1.0.0","supportedVersions":["0.3.1","0.4.0","1.0.0","1.1.0"]}'; exit 0; fi
echo '{"cniVersion":"1.0.0","code":11,"msg":"failer: injected failure (seed 001)"}'
exit 1
`

type system struct {
	name    string
	network string
	conf    func(failer bool) string // the conflist containerd uses
	lost    string                   // a conflist whose DEL does not reach this IPAM
	held    func() (int, error)
	agent   *agentenv.Agent // ipledger only
}

type demo struct {
	tb      testing.TB
	ctx     context.Context
	o       Options
	env     *containerdenv.Env
	c       *cri.Client
	confDir string
	logDir  string
	binDirs []string
	done    atomic.Int64
	errs    atomic.Int64
	total   int
	sys     *system
	faults  []string
	mu      sync.Mutex
}

// Run runs the demo and returns both systems' books (ipledger first).
func Run(ctx context.Context, tb testing.TB, o Options) ([]Books, error) {
	if o.Out == nil {
		o.Out = io.Discard
	}
	bin := agentenv.Bin(tb)
	failDir := tb.TempDir()
	if err := os.WriteFile(filepath.Join(failDir, "failer"), []byte(failerScript), 0o755); err != nil {
		return nil, err
	}
	// every directory a plugin may write to is made before containerd starts, so it
	// is removed after containerd's own cleanup (which still sends DELs)
	lostDir, hlDir := tb.TempDir(), tb.TempDir()
	d := &demo{tb: tb, ctx: ctx, o: o, confDir: tb.TempDir(), logDir: tb.TempDir(), binDirs: []string{bin, failDir, containerdenv.DefaultCNIBinDir}}
	ctd, err := containerdenv.Selected()
	if err != nil {
		return nil, err
	}
	if ctd == containerdenv.Debian {
		ctd = "Debian's"
	}
	fmt.Fprintf(o.Out, "starting a private containerd %s (its own root, state and socket; %s chooses another)\n", ctd, containerdenv.VersionEnv)
	d.env = containerdenv.Start(tb, containerdenv.Options{CNIConfDir: d.confDir, CNIBinDirs: []string{bin, failDir}, CallTimeout: 10 * time.Second})
	d.c = d.env.Client(tb)
	fmt.Fprintln(o.Out, "starting ipledgerd on its embedded store, reconciling against that containerd")
	a := agentenv.Start(tb, agentenv.Options{Args: []string{"--cri-endpoint", d.env.Endpoint(), "--reconcile-interval", "500ms", "--release-grace", "2s", "--reuse-delay", "2s"}})

	lostConf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"elsewhere","plugins":[{"type":"bridge","bridge":"ipldemolost","isGateway":false,"ipMasq":false,"ipam":{"type":"host-local","ranges":[[{"subnet":"10.247.9.0/24"}]],"dataDir":%q}}]}`, lostDir)
	tb.Cleanup(func() { delLink("ipldemolost") })

	ipl := &system{name: "ipledger", network: "demo-ipl", agent: a, lost: lostConf,
		conf: func(failer bool) string {
			p := fmt.Sprintf(`{"type":"ipledger-veth","mtu":1500,"ipam":%s}`, a.IPAM(`[[{"subnet":"10.247.0.0/22"}]]`))
			if failer {
				p += `,{"type":"failer"}`
			}
			return fmt.Sprintf(`{"cniVersion":"1.0.0","name":"demo-ipl","plugins":[%s]}`, p)
		},
		held: func() (int, error) {
			resp, err := a.Call(api.Request{Version: api.Version, Op: api.OpLeases})
			if err != nil {
				return 0, err
			}
			return len(resp.Leases), nil
		}}
	tb.Cleanup(func() { delLink("ipldemo0") })
	hl := &system{name: "host-local", network: "demo-hl", lost: lostConf,
		conf: func(failer bool) string {
			p := fmt.Sprintf(`{"type":"bridge","bridge":"ipldemo0","isGateway":false,"ipMasq":false,"ipam":{"type":"host-local","ranges":[[{"subnet":"10.247.4.0/22"}]],"dataDir":%q}}`, hlDir)
			if failer {
				p += `,{"type":"failer"}`
			}
			return fmt.Sprintf(`{"cniVersion":"1.0.0","name":"demo-hl","plugins":[%s]}`, p)
		},
		held: func() (int, error) {
			ents, err := os.ReadDir(filepath.Join(hlDir, "demo-hl"))
			if errors.Is(err, os.ErrNotExist) {
				return 0, nil
			}
			n := 0
			for _, e := range ents {
				if _, err := netip.ParseAddr(e.Name()); err == nil {
					n++
				}
			}
			return n, err
		}}
	var out []Books
	for _, s := range []*system{ipl, hl} {
		b, err := d.runSystem(s)
		if err != nil {
			return out, err
		}
		out = append(out, b)
	}
	return out, nil
}

func delLink(name string) {
	_ = exec.Command("ip", "link", "del", name).Run()
}

func (d *demo) fault(f string) {
	d.mu.Lock()
	d.faults = append(d.faults, f)
	d.mu.Unlock()
	d.progress()
}

func (d *demo) progress() {
	if d.o.Progress == nil {
		return
	}
	d.mu.Lock()
	last := ""
	if len(d.faults) > 0 {
		last = d.faults[len(d.faults)-1]
	}
	d.mu.Unlock()
	fmt.Fprintf(d.o.Progress, "\r\033[K%-10s %4d/%d sandboxes  %3d errors (retried)  last fault: %s", d.sys.name, d.done.Load(), d.total, d.errs.Load(), last)
}

// setConf writes the network config containerd uses and waits for it to load it.
func (d *demo) setConf(conf string) error {
	p := filepath.Join(d.confDir, "10-demo.conflist")
	if err := os.WriteFile(p+".tmp", []byte(conf), 0o644); err != nil {
		return err
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		return err
	}
	time.Sleep(time.Second) // containerd reloads on the fsnotify event
	return nil
}

var seq atomic.Int64

func (d *demo) pod(kind string) cri.PodSpec {
	n := seq.Add(1)
	return cri.PodSpec{Namespace: "demo", Name: fmt.Sprintf("%s-%s-%d", d.sys.name, kind, n), UID: fmt.Sprintf("uid-%s-%d", d.sys.name, n), LogDir: d.logDir}
}

// run starts a sandbox, retrying while the runtime is restarting; as kubelet, each
// retry is the next attempt (a name the killed runtime reserved stays reserved).
func (d *demo) run(p cri.PodSpec) (string, error) {
	deadline := time.Now().Add(30 * time.Second)
	for ; ; p.Attempt++ {
		id, err := d.c.RunPodSandbox(d.ctx, p)
		d.done.Add(1)
		if err == nil || time.Now().After(deadline) || d.ctx.Err() != nil || strings.Contains(err.Error(), "failer") {
			return id, err
		}
		d.errs.Add(1)
		time.Sleep(200 * time.Millisecond)
	}
}

// retry repeats a kubelet call while the runtime is down, as kubelet does.
func (d *demo) retry(f func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) || d.ctx.Err() != nil {
			return err
		}
		d.errs.Add(1)
		time.Sleep(200 * time.Millisecond)
	}
}

func (d *demo) stopRemove(id string) error {
	if err := d.retry(func() error { return d.c.StopPodSandbox(d.ctx, id) }); err != nil {
		return err
	}
	return d.retry(func() error { return d.c.RemovePodSandbox(d.ctx, id) })
}

// churn runs n run/stop/remove cycles on 4 workers; mid calls inject at halfway.
func (d *demo) churn(n int, mid func()) error {
	var wg sync.WaitGroup
	var next atomic.Int64
	var firstErr atomic.Value
	var midOnce sync.Once
	for w := 0; w < 4; w++ {
		wg.Go(func() {
			for d.ctx.Err() == nil {
				k := next.Add(1)
				if k > int64(n) {
					return
				}
				if k == int64(n/2) && mid != nil {
					midOnce.Do(mid)
				}
				id, err := d.run(d.pod("churn"))
				if err == nil {
					err = d.stopRemove(id)
				}
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
				d.progress()
			}
		})
	}
	wg.Wait()
	if err := d.ctx.Err(); err != nil {
		return err
	}
	if e, ok := firstErr.Load().(error); ok {
		return fmt.Errorf("churn: %w", e)
	}
	return nil
}

// staleDEL sends a DEL through the network's chain, as the runtime would after a
// reboot, with a stale /proc/PID/ns/net path (seed 003): a PID that no longer exists.
func (d *demo) staleDEL(id string) error {
	cfg := libcni.NewCNIConfig(d.binDirs, nil)
	list, err := libcni.ConfListFromBytes([]byte(d.sys.conf(false)))
	if err != nil {
		return err
	}
	rt := &libcni.RuntimeConf{ContainerID: id, NetNS: "/proc/4194303/ns/net", IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}}}
	return cfg.DelNetworkList(d.ctx, list, rt)
}

func (d *demo) runSystem(s *system) (Books, error) {
	d.sys, d.faults = s, nil
	d.done.Store(0)
	d.errs.Store(0)
	o := d.o
	half := o.Churn / 2
	d.total = o.Churn + 4*o.Faulty
	fmt.Fprintf(o.Out, "\n== %s: %d sandboxes through the real containerd, with the seed faults\n", s.name, d.total)
	if err := d.setConf(s.conf(false)); err != nil {
		return Books{}, err
	}
	// 1. churn; halfway, containerd is killed -9 and restarted, and ipledgerd too
	err := d.churn(half, func() {
		d.fault("containerd kill -9")
		d.env.Kill()
		time.Sleep(300 * time.Millisecond)
		d.env.Restart(d.tb)
		d.fault("containerd restarted")
		if s.agent != nil {
			d.fault("ipledgerd kill -9 (DELs spooled meanwhile)")
			s.agent.Kill()
			time.Sleep(500 * time.Millisecond)
			s.agent.Restart()
			d.fault("ipledgerd restarted from its store")
		}
	})
	if err != nil {
		return Books{}, err
	}
	// 2. a DEL with a stale /proc/PID/ns/net path before kubelet's stop (seed 003);
	// RemovePodSandbox's DEL carries an empty CNI_NETNS (seed 000)
	d.fault("DEL with a stale /proc/PID/ns/net path; empty-netns DELs")
	for i := 0; i < o.Faulty; i++ {
		id, err := d.run(d.pod("stale"))
		if err != nil {
			return Books{}, err
		}
		if err := d.staleDEL(id); err != nil {
			d.fault("stale DEL failed: " + firstLine(err.Error()))
		}
		if err := d.stopRemove(id); err != nil {
			return Books{}, err
		}
	}
	// 3. a chained plugin failing ADD and DEL (seed 001); the pods are retried, the
	// plugin recovers, kubelet stops and removes the failed sandboxes
	d.fault("chained plugin fails ADD and DEL")
	if err := d.setConf(s.conf(true)); err != nil {
		return Books{}, err
	}
	for i := 0; i < o.Faulty; i++ {
		if _, err := d.run(d.pod("chain")); err == nil {
			return Books{}, errors.New("a sandbox started with the failing plugin chained")
		}
	}
	if err := d.setConf(s.conf(false)); err != nil {
		return Books{}, err
	}
	sbs, err := d.c.ListSandboxes(d.ctx)
	if err != nil {
		return Books{}, err
	}
	for _, sb := range sbs {
		if err := d.stopRemove(sb.ID); err != nil {
			return Books{}, err
		}
	}
	// 4. sandboxes whose DEL never comes to this IPAM (seed 002/004): they are torn
	// down while the runtime's network config points elsewhere
	d.fault("sandboxes whose DEL never comes")
	var never []string
	for i := 0; i < o.Faulty; i++ {
		id, err := d.run(d.pod("nodel"))
		if err != nil {
			return Books{}, err
		}
		never = append(never, id)
	}
	if err := d.setConf(s.lost); err != nil {
		return Books{}, err
	}
	for _, id := range never {
		if err := d.stopRemove(id); err != nil {
			return Books{}, err
		}
	}
	if err := d.setConf(s.conf(false)); err != nil {
		return Books{}, err
	}
	// 5. more churn, then let the reconciler do its work (grace 2 s)
	d.fault("churn")
	if err := d.churn(o.Churn-half, nil); err != nil {
		return Books{}, err
	}
	// kubelet's garbage collection: sandboxes left by calls the runtime's kill cut
	// short are stopped and removed
	sbs, err = d.c.ListSandboxes(d.ctx)
	if err != nil {
		return Books{}, err
	}
	for _, sb := range sbs {
		if err := d.stopRemove(sb.ID); err != nil {
			return Books{}, err
		}
	}
	b := Books{System: s.name, Sandboxes: int(d.done.Load()), Errors: int(d.errs.Load()), Faults: d.faults}
	deadline := time.Now().Add(15 * time.Second)
	for {
		held, err := s.held()
		if err != nil {
			return b, err
		}
		b.Held = held
		if s.agent == nil || held == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	sbs, err = d.c.ListSandboxes(d.ctx)
	if err != nil {
		return b, err
	}
	b.LiveAtEnd = len(sbs)
	if s.agent != nil {
		a := s.agent.Audit(d.tb)
		b.AuditOK = a.OK
	}
	if d.o.Progress != nil {
		fmt.Fprint(d.o.Progress, "\r\033[K")
	}
	fmt.Fprintf(o.Out, "%s: %d sandboxes, %d runtime errors met and retried, faults: %s\n", s.name, b.Sandboxes, b.Errors, strings.Join(dedup(b.Faults), "; "))
	return b, nil
}

func dedup(xs []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// PrintBooks prints the books side by side.
func PrintBooks(w io.Writer, bs []Books) {
	fmt.Fprintf(w, "\n== the books\n%-12s %10s %14s %14s %8s\n", "system", "pod runs", "held at end", "live at end", "leaked")
	for _, b := range bs {
		fmt.Fprintf(w, "%-12s %10d %14d %14d %8d\n", b.System, b.Sandboxes, b.Held, b.LiveAtEnd, b.Leaked())
	}
}
