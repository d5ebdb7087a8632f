package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cniplugin"
	"github.com/ipledger/ipledger/internal/ipam"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/reconcile"
	"github.com/ipledger/ipledger/internal/spool"
	"github.com/ipledger/ipledger/internal/store/boltstore"
)

// ipledgerSys is ipledger in process: the IPAM plugin's verbs (ipam.Plugin, as the
// ipledger binary runs them) call the agent's request handling (agent.Server.Handle)
// directly instead of through the socket; the agent owns the real ledger on a bbolt
// file and the real reconciler as its guard; DELs the agent cannot take are spooled
// in a real spool directory.
//
// The bbolt file is opened without fsync: the simulator's crashes are in-process (the
// agent's memory is dropped and the file reopened, the page cache survives), so fsync
// would only cost time (a few milliseconds per commit, hours over 100,000 pods) and
// change nothing a simulated crash can observe.
type ipledgerSys struct {
	w      *world
	dir    string
	conf   []byte
	st     *boltstore.Store
	l      *ledger.Ledger
	r      *reconcile.Reconciler
	srv    *agent.Server
	plug   *ipam.Plugin
	spool  string // the DEL spool directory
	shm    string // a tmpfs directory to remove at close
	isDown bool
	armed  bool // the next ADD commits, then the agent dies before answering
	last   netip.Addr
}

var _ backend = (*ipledgerSys)(nil)

func rangeJSON(pool [3]string) string {
	r := map[string]string{"subnet": pool[0]}
	if pool[1] != "" {
		r["rangeStart"], r["rangeEnd"] = pool[1], pool[2]
	}
	b, _ := json.Marshal([][]map[string]string{{r}})
	return string(b)
}

func newIpledger(w *world, dir string, pool [3]string, reserve []string) (*ipledgerSys, error) {
	b := &ipledgerSys{w: w, dir: dir, spool: filepath.Join(dir, "spool")}
	// The spool fsyncs every entry and its directory (as it must on a node); the
	// simulated crashes cannot lose page-cache writes, so the spool lives in memory
	// (tmpfs) when the machine has one: the same code, without waiting on a disk.
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "ipledger-sim-spool-"); err == nil {
			b.spool, b.shm = d, d
		}
	}
	exclude, _ := json.Marshal(reserve)
	b.conf = fmt.Appendf(nil, `{"cniVersion":"1.0.0","name":%q,"type":"ipledger-veth","ipam":{"type":"ipledger","socket":%q,"ranges":%s,"exclude":%s}}`,
		network, filepath.Join(dir, "agent.sock"), rangeJSON(pool), exclude)
	b.plug = &ipam.Plugin{Call: b.call, Stdout: io.Discard, Stderr: io.Discard, Now: w.clk.Now}
	if err := b.open(); err != nil {
		return nil, err
	}
	return b, nil
}

// open starts the agent from its store, as ipledgerd does: ledger, reconciler, server,
// then the spool applied before anything is served.
func (b *ipledgerSys) open() error {
	st, err := boltstore.Open(filepath.Join(b.dir, "state.db"), boltstore.WithoutSync())
	if err != nil {
		return err
	}
	l, err := ledger.Open(st, ledger.Options{Clock: b.w.clk, Boot: b.w.clk, ReuseDelay: reuseDelay, Logger: slog.New(releaseLog{b.w})})
	if err != nil {
		st.Close()
		return err
	}
	r, err := reconcile.New(reconcile.Options{Ledger: l, Runtime: runtime{b.w}, Netns: namespaces{b.w},
		Interval: reconcileEvery, Grace: releaseGrace, Clock: b.w.clk, Boot: b.w.clk})
	if err != nil {
		l.Close()
		return err
	}
	srv, err := agent.New(agent.Config{Ledger: l, Socket: filepath.Join(b.dir, "agent.sock"), SpoolDir: b.spool, Guard: r, Verdicts: r})
	if err != nil {
		l.Close()
		return err
	}
	// as Serve does: publish the spool next to the socket, where the plugin finds it
	if err := spool.Publish(filepath.Join(b.dir, "agent.sock"), b.spool); err != nil {
		l.Close()
		return err
	}
	b.st, b.l, b.r, b.srv, b.isDown = st, l, r, srv, false
	srv.ApplySpool()
	return nil
}

func (b *ipledgerSys) name() string { return "ipledger" }

func (b *ipledgerSys) call(ctx context.Context, _ string, req api.Request) (*api.Response, error) {
	if b.isDown {
		return nil, fmt.Errorf("%w: ipledgerd is down (simulated crash)", api.ErrUnreachable)
	}
	req.Version = api.Version
	resp := b.srv.Handle(ctx, req)
	if b.armed && req.Op == api.OpAdd {
		b.armed = false
		b.kill()
		return nil, fmt.Errorf("%w: ipledgerd killed after committing the ADD", api.ErrNoAnswer)
	}
	if resp.Error != nil {
		return resp, resp.Error
	}
	if resp.Lease != nil && len(resp.Lease.IPs) > 0 {
		p, err := netip.ParsePrefix(resp.Lease.IPs[0])
		if err != nil {
			return nil, err
		}
		b.last = p.Addr()
	}
	return resp, nil
}

func (b *ipledgerSys) args(sb *sandbox, netns string) *cniplugin.Args {
	return &cniplugin.Args{ContainerID: sb.id, Netns: netns, IfName: ifName, StdinData: b.conf,
		Args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=" + podNamespace + ";K8S_POD_NAME=" + sb.pod.name + ";K8S_POD_UID=" + sb.pod.uid}
}

func (b *ipledgerSys) add(sb *sandbox) (netip.Addr, error) {
	var olds []ledger.Lease
	if !b.isDown {
		olds = b.l.LeasesOfPod(network, sb.pod.uid)
	}
	b.last = netip.Addr{}
	err := b.plug.Add(b.args(sb, sb.netns))
	if !b.isDown {
		// supersession releases inside Allocate; see which old leases went
		for _, ls := range olds {
			if _, ok := b.l.Lease(ls.Key); !ok {
				b.w.released(ls.Key.ContainerID, "superseded")
			}
		}
	}
	if err != nil {
		var te *cniplugin.Error
		if errors.As(err, &te) && te.Code == ipam.ErrPoolExhausted {
			return netip.Addr{}, fmt.Errorf("%w: %v", errExhausted, err)
		}
		return netip.Addr{}, err
	}
	if !b.last.IsValid() {
		return netip.Addr{}, errors.New("ipledger: ADD answered without an address")
	}
	return b.last, nil
}

func (b *ipledgerSys) del(sb *sandbox, netns string) error {
	wasDown := b.isDown
	if err := b.plug.Del(b.args(sb, netns)); err != nil {
		return err
	}
	if wasDown {
		b.w.c.spooled++
	}
	return nil
}

func (b *ipledgerSys) round() { b.r.Reconcile(b.w.ctx) }

func (b *ipledgerSys) holds(sb *sandbox) bool {
	if b.isDown {
		return true // the store holds what it held; checked again once the agent is back
	}
	ls, ok := b.l.Lease(ledger.Key{Network: network, ContainerID: sb.id, IfName: ifName})
	return ok && len(ls.IPs) > 0 && ls.IPs[0].Addr() == sb.addr
}

func (b *ipledgerSys) held(exact bool) (int, error) {
	if b.isDown {
		return 0, nil
	}
	if exact {
		return len(b.l.Leases(network)), nil
	}
	ps, err := b.l.Pool(network)
	if err != nil {
		return 0, nil // no pool yet: nothing held
	}
	return ps.InUse, nil
}

func (b *ipledgerSys) kill() {
	b.isDown = true
	b.l.Close()
	b.l, b.r, b.srv, b.st = nil, nil, nil, nil
}

func (b *ipledgerSys) crash(afterNextCommit bool) bool {
	if afterNextCommit {
		b.armed = true
		return true
	}
	b.kill()
	return true
}

func (b *ipledgerSys) restart() error {
	b.armed = false
	if !b.isDown {
		return nil
	}
	return b.open()
}

func (b *ipledgerSys) down() bool                 { return b.isDown }
func (b *ipledgerSys) mainPluginNeedsNetns() bool { return false }

func (b *ipledgerSys) close() error {
	if b.shm != "" {
		defer os.RemoveAll(b.shm)
	}
	if b.isDown {
		return nil
	}
	return b.l.Close()
}

// releaseLog is the ledger's logger: every release the ledger commits (DEL, spooled
// DEL, reconciliation) is reported to the world, which checks it against the
// sandbox's state (invariant 2) and times the reclaim.
type releaseLog struct{ w *world }

var _ slog.Handler = releaseLog{}

func (h releaseLog) Enabled(context.Context, slog.Level) bool { return true }
func (h releaseLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h releaseLog) WithGroup(string) slog.Handler            { return h }
func (h releaseLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "released" {
		return nil
	}
	var key, reason string
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "attachment":
			key = a.Value.String()
		case "reason":
			reason = a.Value.String()
		}
		return true
	})
	parts := strings.Split(key, "/")
	if len(parts) == 3 {
		h.w.released(parts[1], reason)
	}
	return nil
}

// hostLocal is the baseline: Debian's host-local binary, exec'd for every call with
// the CNI protocol (environment and stdin), its state in its own data directory.
type hostLocal struct {
	w    *world
	bin  string
	dir  string
	conf []byte
	n    int
}

var _ backend = (*hostLocal)(nil)

// HostLocalPath is where Debian's containernetworking-plugins installs host-local.
const HostLocalPath = "/usr/lib/cni/host-local"

func newHostLocal(w *world, bin, dir string, pool [3]string) (*hostLocal, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("--host-local %s: %w (install Debian's containernetworking-plugins, or give --baseline-pods 0 to skip the baseline)", bin, err)
	}
	h := &hostLocal{w: w, bin: bin, dir: dir}
	h.conf = fmt.Appendf(nil, `{"cniVersion":"1.0.0","name":%q,"ipam":{"type":"host-local","dataDir":%q,"ranges":%s}}`, network, dir, rangeJSON(pool))
	return h, nil
}

func (h *hostLocal) name() string { return "host-local" }

func (h *hostLocal) exec(verb string, sb *sandbox, netns string) ([]byte, error) {
	cmd := exec.CommandContext(h.w.ctx, h.bin)
	cmd.Env = []string{"CNI_COMMAND=" + verb, "CNI_CONTAINERID=" + sb.id, "CNI_NETNS=" + netns, "CNI_IFNAME=" + ifName,
		"CNI_PATH=" + filepath.Dir(h.bin),
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=" + podNamespace + ";K8S_POD_NAME=" + sb.pod.name + ";K8S_POD_UID=" + sb.pod.uid}
	cmd.Stdin = bytes.NewReader(h.conf)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		var cniErr cniplugin.Error
		if json.Unmarshal(out.Bytes(), &cniErr) == nil && cniErr.Msg != "" {
			if strings.Contains(cniErr.Msg, "no IP addresses available") {
				return nil, fmt.Errorf("%w: host-local: %s", errExhausted, cniErr.Msg)
			}
			return nil, fmt.Errorf("host-local %s: %s", verb, cniErr.Msg)
		}
		if h.w.ctx.Err() != nil {
			return nil, h.w.ctx.Err()
		}
		return nil, fmt.Errorf("host-local %s: %v: %s", verb, err, strings.TrimSpace(stderr.String()))
	}
	return out.Bytes(), nil
}

func (h *hostLocal) add(sb *sandbox) (netip.Addr, error) {
	out, err := h.exec("ADD", sb, sb.netns)
	if err != nil {
		if !errors.Is(err, errExhausted) && h.w.ctx.Err() == nil {
			h.w.err = err // an unexpected failure of the baseline is a broken run
		}
		return netip.Addr{}, err
	}
	var res struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.IPs) == 0 {
		return netip.Addr{}, fmt.Errorf("host-local ADD: result %q: %v", out, err)
	}
	p, err := netip.ParsePrefix(res.IPs[0].Address)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("host-local ADD: %w", err)
	}
	h.n++
	return p.Addr(), nil
}

func (h *hostLocal) del(sb *sandbox, netns string) error {
	if _, err := h.exec("DEL", sb, netns); err != nil {
		if h.w.ctx.Err() == nil {
			h.w.err = err
		}
		return err
	}
	if h.w.released(sb.id, "DEL") {
		h.n--
	}
	return nil
}

func (h *hostLocal) round() {}

func (h *hostLocal) holds(sb *sandbox) bool {
	b, err := os.ReadFile(filepath.Join(h.dir, network, sb.addr.String()))
	return err == nil && strings.HasPrefix(string(b), sb.id)
}

// held counts the addresses host-local's books hold: exact reads its data directory
// (one file per address), otherwise the count kept from its answers.
func (h *hostLocal) held(exact bool) (int, error) {
	if !exact {
		return h.n, nil
	}
	ents, err := os.ReadDir(filepath.Join(h.dir, network))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range ents {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			n++
		}
	}
	return n, nil
}

func (h *hostLocal) crash(bool) bool            { return false }
func (h *hostLocal) restart() error             { return nil }
func (h *hostLocal) down() bool                 { return false }
func (h *hostLocal) mainPluginNeedsNetns() bool { return true }
func (h *hostLocal) close() error               { return nil }
