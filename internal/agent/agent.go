// Package agent is the node agent's server: it owns the ledger and answers the
// plugins and the CLI on a root-only unix socket, one request per connection,
// serializing requests per attachment while unrelated attachments proceed in parallel.
package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledgerview"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/spool"
)

// Guard is the runtime's say in releases, implemented by the reconciler. A nil Guard
// means no runtime is configured.
type Guard interface {
	// Supersedable returns those of olds (leases of the same pod UID under other
	// sandboxes) that the runtime confirms are not READY or gone and no longer use
	// their addresses. When the runtime cannot tell, it returns none.
	Supersedable(ctx context.Context, olds []ledger.Lease) []ledger.Key
	// MayRelease reports whether GC may release ls: never when its sandbox is READY or
	// the runtime cannot tell.
	MayRelease(ctx context.Context, ls ledger.Lease) bool
	// Annotate fills in the reconciler's view of a lease (sandbox state, suspicion).
	Annotate(v *api.LeaseView)
	// Summary fills in the reconciler's counts for an audit.
	Summary(a *api.Audit)
}

// Config wires a Server.
type Config struct {
	Ledger *ledger.Ledger
	Socket string
	// SpoolDir is the DEL spool this agent applies; Serve publishes it next to Socket
	// (spool.Publish) so that plugins spool nowhere else. Empty: no spool.
	SpoolDir      string
	SpoolInterval time.Duration // default 2s
	Guard         Guard
	// Runtime answers the operator's questions about the container runtime (doctor,
	// release, readiness); nil when no runtime is configured.
	Runtime RuntimeInfo
	// Cluster is the block manager in cluster mode; nil in node mode. Datastore
	// names its datastore (kubernetes, etcd) for the operator.
	Cluster   Cluster
	Datastore string
	Logger    *slog.Logger
	// Clock gives the monotonic time for how-long-ago decisions; default the system's.
	Clock clock.Clock
	// DrainTimeout is how long shutdown waits for requests in flight before it warns
	// (it keeps waiting: the ledger must not close under a request); default 30s.
	DrainTimeout time.Duration
	// MaxConns bounds the connections served at once; default DefaultMaxConns.
	MaxConns int
	// ReadTimeout bounds reading one request from a connection; default
	// DefaultReadTimeout.
	ReadTimeout time.Duration
}

// Bounds on what a client can hold of the agent.
const (
	// DefaultMaxConns connections are served at once. Every CNI call is one short
	// connection and a node runs a few tens of pod starts at once at most; 128 leaves
	// room for bursts and CLI calls while bounding goroutines, file descriptors and
	// buffered requests (128 x api.MaxRequest = 32 MiB at worst).
	DefaultMaxConns = 128
	// DefaultReadTimeout bounds reading a request: a plugin writes its few KiB right
	// after connecting, so 5s is generous even on a loaded node, and a connection that
	// sends nothing gives its slot back quickly.
	DefaultReadTimeout = 5 * time.Second
	// writeTimeout bounds writing an answer to a client that does not read it.
	writeTimeout = 10 * time.Second
)

// Counter names the server adds to its Stats (exposed as metrics).
const (
	CounterSpoolApplied   = "spool_applied"   // spooled DELs applied
	CounterSpoolUnmatched = "spool_unmatched" // spooled DELs applied that matched no lease
	CounterSpoolRejected  = "spool_rejected"  // spool entries moved aside unapplied
	CounterAcceptErrors   = "accept_errors"   // failed Accepts (the server retries)
	CounterConnsEvicted   = "conns_evicted"   // idle connections closed to admit another
)

// Server serves the agent API.
type Server struct {
	cfg   Config
	log   *slog.Logger
	locks keyLocks
	wg    sync.WaitGroup // connections being served
	stats *Stats
	spool *spool.Dir // nil: no spool
	sem   chan struct{}
	conns connSet
	clock *clockWatch // wall-clock steps seen, for doctor and metrics
	// idle hands a connection to a parked worker (unbuffered: only a worker waiting
	// in receive takes it); idleN counts the parked workers.
	idle  chan *trackedConn
	idleN atomic.Int32
}

// New checks cfg and returns a server.
func New(cfg Config) (*Server, error) {
	if cfg.Ledger == nil || cfg.Socket == "" {
		return nil, errors.New("agent: ledger and socket are required")
	}
	if cfg.SpoolInterval <= 0 {
		cfg.SpoolInterval = 2 * time.Second
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.NewSystem()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: log, locks: keyLocks{m: map[ledger.Key]*keyLock{}}, stats: newStats(),
		sem: make(chan struct{}, cfg.MaxConns), conns: connSet{m: map[*trackedConn]struct{}{}}, clock: &clockWatch{},
		idle: make(chan *trackedConn)}
	if cfg.SpoolDir != "" {
		s.spool = spool.Open(cfg.SpoolDir, cfg.Clock.Mono)
	}
	if cfg.Cluster != nil {
		s.stats.registerCluster(cfg.Cluster.Counts)
	}
	return s, nil
}

// Stats are the server's counters, for metrics.
func (s *Server) Stats() *Stats { return s.stats }

// ErrSocketBusy is returned by Listen when another process may be serving the socket
// (it answered, or could not be ruled out): an ipledgerd being replaced, typically.
var ErrSocketBusy = errors.New("socket busy")

// Listen removes a stale socket safely (only a socket nobody answers on) and listens
// with mode 0600. When another process may own the socket it fails with an error
// wrapping ErrSocketBusy and leaves the socket alone.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("socket directory %s: %w", filepath.Dir(path), err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("--socket %s exists and is not a socket; refusing to remove it: choose another path or remove it yourself", path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("%w: --socket %s: another ipledgerd is serving on it; stop it first", ErrSocketBusy, path)
		}
		// Only a refused connection proves nobody listens; a timeout or a full
		// backlog may be a busy agent, whose socket must not be taken from it.
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w: --socket %s exists and its owner could not be ruled out (%v); is another ipledgerd running? stop it, or remove the socket yourself", ErrSocketBusy, path, err)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale socket %s: %w", path, err)
		}
	}
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("--socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// Ordering spooled DELs against ADDs, without clocks.
//
// A spooled DEL names an attachment, not a lease, and the plugin's wall clock says
// nothing reliable about when it was written relative to the ledger's leases (clocks
// step). The order comes from the attachment's lock instead:
//
//   - Every request that can hand the attachment a lease (ADD) first takes the
//     attachment's lock and applies its pending entry, if any (settleSpooled), before
//     it allocates; the entry's removal is durable before the ADD answers.
//   - Every spool pass takes the attachment's lock per entry and re-reads the entry
//     under it.
//
// A runtime sends an attachment's DEL and its next ADD one after the other, and the
// plugin answers a spooled DEL only after the entry is in place. So a DEL answered
// before an ADD was sent is applied by that ADD, before it allocates. Any entry a
// later pass finds was therefore written after the last ADD of its attachment started:
// it refers to the lease that ADD made (the runtime tore that attachment down, maybe
// after giving up on the ADD) or to nothing, and releasing the attachment's current
// lease is right in both cases. No timestamp is compared; an entry that matches no
// lease is logged and counted (CounterSpoolUnmatched).

// settleSpooled applies the pending spooled DEL of k, if any. The caller holds k's
// lock. It fails only when the entry could not be applied (the store failed); an entry
// rejected as untrustworthy is logged, counted and moved aside, and does not fail it.
// The ledger's log line of the release goes to later (nil: written at once).
func (s *Server) settleSpooled(k ledger.Key, later *ledger.LogLines) error {
	if s.spool == nil {
		return nil
	}
	applied, err := s.spool.Take(ledgerview.Key(k), func(e spool.Entry) error {
		detail := "spooled DEL (plugin clock " + e.Spooled.Format(time.RFC3339) + ")"
		_, ok, err := s.cfg.Ledger.ReleaseLogLater(k, ledger.ReasonDEL, detail, later)
		if err != nil {
			return err
		}
		if ok {
			s.stats.Released(ledger.ReasonDEL, 1)
		}
		if !ok {
			s.log.Warn("spooled DEL matched no lease (released since, or never allocated)", "attachment", k.String(), "spooled", e.Spooled)
			s.stats.add(CounterSpoolUnmatched, 1)
		}
		return nil
	})
	if applied {
		s.log.Info("applied a spooled DEL", "attachment", k.String())
		s.stats.add(CounterSpoolApplied, 1)
	}
	if errors.Is(err, spool.ErrRejected) {
		s.log.Error("DEL spool", "err", err)
		s.stats.add(CounterSpoolRejected, 1)
		return nil
	}
	return err
}

// ApplySpool applies every spooled DEL, each under its attachment's lock, and tidies
// the spool (bad entries moved aside, stale temporary files removed). Serve calls it
// before its first Accept, periodically, and after draining.
func (s *Server) ApplySpool() {
	if s.spool == nil {
		return
	}
	keys, err := s.spool.Pending()
	if err != nil {
		s.log.Error("DEL spool", "err", err)
		s.stats.add(CounterSpoolRejected, countRejected(err))
	}
	for _, sk := range keys {
		k := ledgerKey(sk)
		unlock := s.locks.lock(k)
		err := s.settleSpooled(k, nil)
		unlock()
		if err != nil {
			s.log.Error("DEL spool: entry kept for the next pass", "attachment", k.String(), "err", err)
		}
	}
}

func countRejected(err error) int {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		n := 0
		for _, e := range j.Unwrap() {
			if errors.Is(e, spool.ErrRejected) {
				n++
			}
		}
		return n
	}
	if errors.Is(err, spool.ErrRejected) {
		return 1
	}
	return 0
}

// Serve publishes the spool next to the socket, applies it, then answers on ln until
// ctx is done or ln is closed. Accept errors (EMFILE, ECONNABORTED, ...) do not end
// it: it backs off and retries. At the end it stops accepting, waits for every
// connection it accepted to be answered (warning each DrainTimeout; the caller closes
// the ledger only after Serve returns), applies the spool once more and returns: nil
// after ctx is done, the listener's error otherwise.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if s.spool != nil {
		if err := spool.Publish(s.cfg.Socket, s.spool.Path()); err != nil {
			return err
		}
	}
	s.ApplySpool()
	bgCtx, stopBg := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Add(1)
	go func() {
		defer bg.Done()
		t := time.NewTicker(s.cfg.SpoolInterval)
		defer t.Stop()
		for {
			select {
			case <-bgCtx.Done():
				return
			case <-t.C:
				s.ApplySpool()
			}
		}
	}()
	stopClose := context.AfterFunc(ctx, func() { ln.Close() })
	defer stopClose()
	// the parked connection workers end with Serve
	wctx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	var result error
	var delay time.Duration
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if errors.Is(err, net.ErrClosed) {
				result = fmt.Errorf("listener closed: %w", err)
				break
			}
			// Everything else (EMFILE, ENFILE, ECONNABORTED, ENOBUFS, a timeout) is
			// the moment's trouble, not the listener's end: back off as net/http
			// does, 5ms doubling to 1s, and keep serving.
			if delay == 0 {
				delay = 5 * time.Millisecond
			} else if delay *= 2; delay > time.Second {
				delay = time.Second
			}
			s.stats.add(CounterAcceptErrors, 1)
			s.log.Warn("accept failed; retrying", "err", err, "retry_in", delay)
			select {
			case <-time.After(delay):
			case <-ctx.Done():
			}
			continue
		}
		delay = 0
		if !s.admit(wctx, conn) {
			break
		}
	}
	// Connections still reading their request are served too (a client that sent
	// half its request before the signal gets its answer); ReadTimeout bounds them.
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-time.After(s.cfg.DrainTimeout):
			s.log.Warn("drain: requests still in flight; waiting for them before the ledger closes", "after", s.cfg.DrainTimeout)
		}
	}
	stopBg()
	bg.Wait()
	s.ApplySpool()
	return result
}

// admit serves conn once a connection slot is free. When every slot is taken it closes
// the oldest connection still waiting for its request (a client that connected and
// sent nothing holds a slot only until a busier moment needs it), then waits for a
// slot. It returns false when ctx ended while waiting.
func (s *Server) admit(ctx context.Context, conn net.Conn) bool {
	select {
	case s.sem <- struct{}{}:
	default:
		if s.conns.evictOldestReading() {
			s.stats.add(CounterConnsEvicted, 1)
		}
		select {
		case s.sem <- struct{}{}:
		case <-ctx.Done():
			conn.Close()
			return false
		}
	}
	tc := s.conns.add(conn)
	s.wg.Add(1)
	select {
	case s.idle <- tc:
	default:
		go s.work(ctx, tc)
	}
	return true
}

// Connection workers: a connection goes to a parked worker when one waits, else to a
// new goroutine; after its connection a worker parks, unless maxIdleWorkers already
// do (then it ends), until the next connection or the end of ctx (Serve's).
//
// Why not a goroutine per connection: a new goroutine grows its stack through the
// request path on every call (runtime.newstack and copystack) and is created from the
// accept loop, on the path of the next Accept. A parked worker keeps its grown stack
// and handing it a connection creates nothing.
func (s *Server) work(ctx context.Context, tc *trackedConn) {
	for {
		s.serveConn(ctx, tc)
		if s.idleN.Add(1) > maxIdleWorkers {
			s.idleN.Add(-1)
			return
		}
		select {
		case tc = <-s.idle:
			s.idleN.Add(-1)
		case <-ctx.Done():
			s.idleN.Add(-1)
			return
		}
	}
}

// maxIdleWorkers bounds the parked workers: CNI calls on a node come one or a few at
// a time; a burst's extra goroutines end after it.
const maxIdleWorkers = 4

// serveConn serves one admitted connection and gives its slot back.
func (s *Server) serveConn(ctx context.Context, tc *trackedConn) {
	defer s.wg.Done()
	defer func() { <-s.sem }()
	defer s.conns.remove(tc)
	s.handleConn(ctx, tc)
}

// readers are the connections' request readers: one per connection at a time, reused
// (a new 4 KiB reader per request would be a third of the agent's allocations).
var readers = sync.Pool{New: func() any { return bufio.NewReader(nil) }}

// handleConn reads one request, answers it, and then writes what need not delay the
// answer: the ledger's log lines of the request's changes (durable before the answer
// either way; the line reports the change, it is not its record) and the request's
// metrics.
func (s *Server) handleConn(ctx context.Context, tc *trackedConn) {
	conn := tc.conn
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(s.cfg.ReadTimeout))
	br := readers.Get().(*bufio.Reader)
	br.Reset(conn)
	req, err := api.ReadRequest(br)
	br.Reset(nil)
	readers.Put(br)
	if !s.conns.startHandling(tc) {
		return // evicted before its request was read
	}
	var resp *api.Response
	switch {
	case errors.Is(err, api.ErrRequestTooLarge):
		resp = errResp(&api.Error{Code: api.CodeInvalid, Msg: err.Error()})
		s.stats.observe(opUnknown, 0, resp)
		s.answer(conn, resp)
		// let the client finish writing, so that it reads the answer instead of a
		// broken pipe; bounded by the read deadline and a byte budget
		io.CopyN(io.Discard, conn, 4*api.MaxRequest)
		return
	case err != nil:
		if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, io.EOF) {
			return // nothing (complete) was asked; nobody waits for an answer
		}
		resp = errResp(&api.Error{Code: api.CodeInvalid, Msg: err.Error()})
	default:
		// requests in flight finish even when shutdown starts
		var later ledger.LogLines
		start := time.Now()
		resp, counted := s.handle(context.WithoutCancel(ctx), req, &later)
		took := time.Since(start)
		s.answer(conn, resp)
		later.Write()
		if counted {
			s.stats.observe(opLabel(req.Op), took, resp)
		}
		return
	}
	s.answer(conn, resp)
}

func (s *Server) answer(conn net.Conn, resp *api.Response) {
	resp.Version = api.Version
	b, _ := api.MarshalResponse(resp) // json.Marshal's bytes, without reflection for ADD and DEL
	conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	conn.Write(append(b, '\n'))
}

// connSet tracks the connections being served, and which of them are still waiting
// for their request.
type connSet struct {
	mu  sync.Mutex
	seq uint64
	m   map[*trackedConn]struct{}
}

type trackedConn struct {
	conn     net.Conn
	seq      uint64
	handling bool // its request was read: it is never evicted
	closed   bool // evicted before its request was read
}

func (cs *connSet) add(c net.Conn) *trackedConn {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.seq++
	tc := &trackedConn{conn: c, seq: cs.seq}
	cs.m[tc] = struct{}{}
	return tc
}

func (cs *connSet) remove(tc *trackedConn) {
	cs.mu.Lock()
	delete(cs.m, tc)
	cs.mu.Unlock()
}

// startHandling marks tc as handling its request; false when it was closed first.
func (cs *connSet) startHandling(tc *trackedConn) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if tc.closed {
		return false
	}
	tc.handling = true
	return true
}

// evictOldestReading closes the oldest connection still waiting for its request.
func (cs *connSet) evictOldestReading() bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	var oldest *trackedConn
	for tc := range cs.m {
		if !tc.handling && !tc.closed && (oldest == nil || tc.seq < oldest.seq) {
			oldest = tc
		}
	}
	if oldest == nil {
		return false
	}
	oldest.closed = true
	oldest.conn.Close()
	return true
}

func errResp(e *api.Error) *api.Response { return &api.Response{Error: e} }

// errorOf maps ledger errors to API error codes.
func errorOf(err error) *api.Error {
	code := api.CodeInternal
	switch {
	// first: a full block whose successor could not be claimed wraps both
	case errors.Is(err, cluster.ErrFenced), errors.Is(err, cluster.ErrNotStarted), errors.Is(err, datastore.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		// the node cannot serve this now (datastore away, lease not provable); the
		// runtime retries
		code = api.CodeUnavailable
	case errors.Is(err, ledger.ErrPoolExhausted):
		code = api.CodeExhausted
	case errors.Is(err, ledger.ErrPoolConflict):
		code = api.CodeConflict
	case errors.Is(err, ledger.ErrInvalidAttachment), errors.Is(err, pool.ErrInvalidRange), errors.Is(err, ledger.ErrUnknownNetwork):
		code = api.CodeInvalid
	case errors.Is(err, ledger.ErrStore), errors.Is(err, ledger.ErrCorrupt):
		code = api.CodeStore
	case errors.Is(err, cluster.ErrPoolMismatch):
		code = api.CodeConflict
	}
	return &api.Error{Code: code, Msg: err.Error()}
}

// Handle answers one request: its changes are durable and their log lines written
// when it returns, and the request is counted in the metrics.
func (s *Server) Handle(ctx context.Context, req api.Request) *api.Response {
	start := time.Now()
	resp, counted := s.handle(ctx, req, nil)
	if counted {
		s.stats.observe(opLabel(req.Op), time.Since(start), resp)
	}
	return resp
}

// handle answers one request, handing the ledger's log lines of an ADD or a DEL to
// later (nil: written before it returns). counted is false for a request the
// metrics do not count (another protocol version).
func (s *Server) handle(ctx context.Context, req api.Request, later *ledger.LogLines) (resp *api.Response, counted bool) {
	if req.Version != api.Version {
		return errResp(&api.Error{Code: api.CodeInvalid, Msg: fmt.Sprintf("protocol version %d; this agent speaks %d: use plugin and agent binaries of one release", req.Version, api.Version)}), false
	}
	switch req.Op {
	case api.OpAdd:
		resp = s.add(ctx, req, later)
	case api.OpDel:
		resp = s.del(req, later)
	case api.OpCheck:
		resp = s.check(req)
	case api.OpGC:
		resp = s.gc(ctx, req)
	case api.OpStatus:
		resp = s.status(req)
	case api.OpLeases:
		resp = s.leases(req)
	case api.OpAudit:
		resp = s.audit()
	case api.OpHistory:
		resp = s.history(req)
	case api.OpRelease:
		resp = s.release(ctx, req)
	case api.OpPing:
		resp = &api.Response{}
	case api.OpDoctor:
		resp = s.doctor(ctx)
	case api.OpBlocks:
		resp = s.blocks(ctx)
	case api.OpCNI:
		// counted as verb "cni" (the whole call), and its inner requests each under
		// its own verb
		resp = s.cni(ctx, req, later)
	default:
		resp = errResp(&api.Error{Code: api.CodeInvalid, Msg: fmt.Sprintf("op %q is not one of add, del, check, gc, status, leases, audit, history, release, ping, doctor, blocks, cni", clip(req.Op))})
	}
	return resp, true
}

// opUnknown is the metric label of every op the agent does not know: a client's
// string never becomes a label of its own, so no client can grow the metric series.
const opUnknown = "unknown"

func opLabel(op string) string { return bounded(op, verbs, opUnknown) }

// clip shortens a client's string for an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// keyOf is the attachment req names, as the ledger keys it.
func keyOf(req api.Request) ledger.Key { return ledgerKey(req.Key()) }

// ledgerKey is an attachment's key as the ledger keys it.
func ledgerKey(k api.Key) ledger.Key {
	return ledger.Key{Network: k.Network, ContainerID: k.ContainerID, IfName: k.IfName}
}

// podOf is a request's pod as the ledger records it.
func podOf(p api.Pod) ledger.Pod {
	return ledger.Pod{Namespace: p.Namespace, Name: p.Name, UID: p.UID, InfraContainerID: p.InfraContainerID}
}

// netnsOf is a request's network namespace as the ledger records it.
func netnsOf(n api.NetNS) ledger.NetNS {
	return ledger.NetNS{Path: n.Path, Dev: n.Dev, Ino: n.Ino}
}

func (s *Server) view(ls ledger.Lease) api.LeaseView {
	var ranges []pool.RangeSet
	if ps, err := s.cfg.Ledger.Pool(ls.Key.Network); err == nil {
		ranges = ps.Ranges
	}
	return s.viewIn(ls, ranges)
}

// viewIn is view with the ranges of the lease's pool given. ADD knows them: they are
// its request's, which the ledger allocated from only because they equal the pool's.
// Asking the ledger instead waits for its lock, which the next group commit holds
// through its fsync: in a burst, every ADD's answer would wait for one more commit.
func (s *Server) viewIn(ls ledger.Lease, ranges []pool.RangeSet) api.LeaseView {
	v := ledgerview.Lease(ls, ranges)
	s.annotateBlock(&v, ls)
	if s.cfg.Guard != nil {
		s.cfg.Guard.Annotate(&v)
		s.annotateVerdict(&v)
	}
	return v
}

func (s *Server) add(ctx context.Context, req api.Request, later *ledger.LogLines) *api.Response {
	k := keyOf(req)
	if err := k.Validate(); err != nil {
		return errResp(errorOf(err))
	}
	if len(req.Ranges) == 0 {
		return errResp(&api.Error{Code: api.CodeInvalid, Msg: "ipam.ranges: missing; give the network's ranges"})
	}
	if n := api.CountRanges(req.Ranges); n > api.MaxRanges {
		return errResp(&api.Error{Code: api.CodeInvalid, Msg: fmt.Sprintf("ipam.ranges: %d ranges; at most %d in one network", n, api.MaxRanges)})
	}
	unlock := s.locks.lock(k)
	defer unlock()
	// a DEL of this attachment spooled before this ADD was sent is applied first: it
	// must release the lease it was meant for now, not a lease this ADD answers
	if err := s.settleSpooled(k, later); err != nil {
		return errResp(errorOf(err))
	}
	areq := ledger.AllocateRequest{Key: k, Pod: podOf(req.Pod), NetNS: netnsOf(req.NetNS), Ranges: req.Ranges, LogLater: later}
	if req.Pod.UID != "" && s.cfg.Guard != nil {
		if _, held := s.cfg.Ledger.Lease(k); !held {
			var olds []ledger.Lease
			for _, ls := range s.cfg.Ledger.LeasesOfPod(k.Network, req.Pod.UID) {
				if ls.Key != k && ls.Key.IfName == k.IfName {
					olds = append(olds, ls)
				}
			}
			if len(olds) > 0 {
				// release only the holders that were judged: if a key's lease changed
				// since (a new ADD of that attachment), the ledger keeps it
				judged := map[ledger.Key]ledger.Lease{}
				for _, ls := range olds {
					judged[ls.Key] = ls
				}
				for _, ok := range s.cfg.Guard.Supersedable(ctx, olds) {
					if ls, found := judged[ok]; found {
						areq.SupersedeHolders = append(areq.SupersedeHolders, ledger.HolderOf(ls))
					}
				}
			}
		}
	}
	var superseding []ledger.Key
	for _, h := range areq.SupersedeHolders {
		superseding = append(superseding, h.Key)
	}
	superseding = s.held(superseding)
	ls, existed, err := s.allocate(ctx, areq, req.BlockSize)
	if err != nil {
		return errResp(errorOf(err))
	}
	s.countSuperseded(superseding)
	v := s.viewIn(ls, req.Ranges)
	return &api.Response{Lease: &v, Existed: existed}
}

func (s *Server) del(req api.Request, later *ledger.LogLines) *api.Response {
	k := keyOf(req)
	if err := k.Validate(); err != nil {
		return errResp(errorOf(err))
	}
	unlock := s.locks.lock(k)
	defer unlock()
	// a pending spooled DEL of this attachment is applied with it, so that it cannot
	// outlive this DEL and meet a later lease
	if err := s.settleSpooled(k, later); err != nil {
		return errResp(errorOf(err))
	}
	_, ok, err := s.cfg.Ledger.ReleaseLogLater(k, ledger.ReasonDEL, req.Detail, later)
	if err != nil {
		return errResp(errorOf(err))
	}
	resp := &api.Response{}
	if ok {
		resp.Released = 1
	}
	return resp
}

func (s *Server) check(req api.Request) *api.Response {
	k := keyOf(req)
	if err := k.Validate(); err != nil {
		return errResp(errorOf(err))
	}
	ls, ok := s.cfg.Ledger.Lease(k)
	if !ok {
		return errResp(&api.Error{Code: api.CodeNotFound, Msg: fmt.Sprintf("attachment %s holds no lease", k)})
	}
	if len(req.IPs) > 0 {
		want := map[netip.Addr]bool{}
		for _, p := range ls.IPs {
			want[p.Addr()] = true
		}
		for _, s := range req.IPs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				a, aerr := netip.ParseAddr(s)
				if aerr != nil {
					return errResp(&api.Error{Code: api.CodeInvalid, Msg: fmt.Sprintf("prevResult.ips: %q is not an address", s)})
				}
				p = netip.PrefixFrom(a, a.BitLen())
			}
			if !want[p.Addr()] {
				return errResp(&api.Error{Code: api.CodeMismatch, Msg: fmt.Sprintf("attachment %s: address %s is not leased to it (it holds %v)", k, p.Addr(), ls.IPs)})
			}
			delete(want, p.Addr())
		}
		if len(want) > 0 {
			return errResp(&api.Error{Code: api.CodeMismatch, Msg: fmt.Sprintf("attachment %s holds %v, prevResult lacks some of them", k, ls.IPs)})
		}
	}
	if req.NetNS.Ino != 0 && ls.NetNS.Ino != 0 && (req.NetNS.Ino != ls.NetNS.Ino || req.NetNS.Dev != ls.NetNS.Dev) {
		return errResp(&api.Error{Code: api.CodeMismatch, Msg: fmt.Sprintf("attachment %s: CNI_NETNS %s is namespace %d:%d, the lease was made for %d:%d", k, req.NetNS.Path, req.NetNS.Dev, req.NetNS.Ino, ls.NetNS.Dev, ls.NetNS.Ino)})
	}
	v := s.view(ls)
	return &api.Response{Lease: &v}
}

func (s *Server) gc(ctx context.Context, req api.Request) *api.Response {
	if req.Network == "" {
		return errResp(&api.Error{Code: api.CodeInvalid, Msg: "name: the network name is required for GC"})
	}
	valid := map[ledger.Key]bool{}
	for _, a := range req.Valid {
		valid[ledger.Key{Network: req.Network, ContainerID: a.ContainerID, IfName: a.IfName}] = true
	}
	var drop []ledger.Lease
	for _, ls := range s.cfg.Ledger.Leases(req.Network) {
		if valid[ls.Key] {
			continue
		}
		if s.cfg.Guard != nil && !s.cfg.Guard.MayRelease(ctx, ls) {
			s.log.Warn("GC keeps a lease the runtime says is in use or cannot vouch for", "attachment", ls.Key.String())
			continue
		}
		drop = append(drop, ls)
	}
	// Lock each attachment so a concurrent ADD or DEL of it is not interleaved, and
	// release only the holder that was judged: not one the attachment got since.
	// A failed release does not stop the others: the CNI spec asks GC to collect as
	// much as it can and report every failure.
	var released int
	var failed []error
	for _, ls := range drop {
		unlock := s.locks.lock(ls.Key)
		_, ok, err := s.cfg.Ledger.ReleaseIfCreated(ls.Key, ls.Created, ledger.ReasonGC, "not in cni.dev/valid-attachments")
		unlock()
		if err != nil {
			failed = append(failed, fmt.Errorf("%s: %w", ls.Key, err))
			continue
		}
		if ok {
			released++
		}
	}
	resp := &api.Response{Released: released}
	if len(failed) > 0 {
		resp.Error = gcError(released, failed)
	}
	return resp
}

// gcError reports every failed release of a GC (the first few in full).
func gcError(released int, failed []error) *api.Error {
	const shown = 8
	e := errorOf(failed[0])
	msg := fmt.Sprintf("GC released %d leases and failed to release %d:", released, len(failed))
	for i, err := range failed {
		if i == shown {
			msg += fmt.Sprintf(" ... and %d more", len(failed)-shown)
			break
		}
		msg += " [" + err.Error() + "]"
	}
	e.Msg = msg
	return e
}

func (s *Server) status(req api.Request) *api.Response {
	if s.cfg.Cluster != nil {
		return s.clusterStatus(req)
	}
	if req.Network == "" {
		return &api.Response{}
	}
	ps, err := s.cfg.Ledger.Pool(req.Network)
	if errors.Is(err, ledger.ErrUnknownNetwork) {
		return &api.Response{}
	}
	if err != nil {
		return errResp(errorOf(err))
	}
	pv := ledgerview.Pool(ps)
	if !ps.Available {
		return &api.Response{Pool: &pv, Error: &api.Error{Code: api.CodeExhausted, Msg: fmt.Sprintf("network %q: no address can be allocated now (%d in use, %d waiting out the reuse delay)", req.Network, ps.InUse, ps.Free)}}
	}
	return &api.Response{Pool: &pv}
}

func (s *Server) leases(req api.Request) *api.Response {
	views := []api.LeaseView{}
	for _, ls := range s.cfg.Ledger.Leases(req.Network) {
		views = append(views, s.view(ls))
	}
	return &api.Response{Leases: views}
}

func (s *Server) audit() *api.Response {
	rep, err := s.cfg.Ledger.Audit()
	if err != nil {
		return errResp(errorOf(err))
	}
	a := &api.Audit{Live: rep.Live, DoubleAssigned: len(rep.DoubleAssigned), Doubles: ledgerview.Doubles(rep.DoubleAssigned), Problems: rep.Problems, Pools: ledgerview.Pools(rep.Pools), Runtime: "none"}
	if s.cfg.Guard != nil {
		s.cfg.Guard.Summary(a)
	}
	a.OK = rep.OK && a.Leaked == 0
	return &api.Response{Audit: a}
}

func (s *Server) history(req api.Request) *api.Response {
	ip, err := netip.ParseAddr(req.IP)
	if err != nil {
		return errResp(&api.Error{Code: api.CodeInvalid, Msg: fmt.Sprintf("ip: %q is not an IP address", req.IP)})
	}
	h, err := s.cfg.Ledger.History(req.Network, ip)
	if err != nil {
		return errResp(errorOf(err))
	}
	if h == nil {
		h = []ledger.Release{}
	}
	return &api.Response{History: ledgerview.Releases(h)}
}

func (s *Server) release(ctx context.Context, req api.Request) *api.Response {
	k := keyOf(req)
	if err := k.Validate(); err != nil {
		return errResp(errorOf(err))
	}
	if e := s.releaseAllowed(ctx, req); e != nil {
		return errResp(e)
	}
	unlock := s.locks.lock(k)
	defer unlock()
	detail := req.Detail
	if detail == "" {
		detail = "released by an operator"
	}
	_, ok, err := s.cfg.Ledger.Release(k, ledger.ReasonManual, detail)
	if err != nil {
		return errResp(errorOf(err))
	}
	if !ok {
		return errResp(&api.Error{Code: api.CodeNotFound, Msg: fmt.Sprintf("attachment %s holds no lease", k)})
	}
	return &api.Response{Released: 1}
}

// keyLocks serializes requests per attachment.
type keyLocks struct {
	mu sync.Mutex
	m  map[ledger.Key]*keyLock
}

type keyLock struct {
	mu   sync.Mutex
	refs int
}

func (kl *keyLocks) lock(k ledger.Key) func() {
	kl.mu.Lock()
	l := kl.m[k]
	if l == nil {
		l = &keyLock{}
		kl.m[k] = l
	}
	l.refs++
	kl.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		kl.mu.Lock()
		l.refs--
		if l.refs == 0 {
			delete(kl.m, k)
		}
		kl.mu.Unlock()
	}
}
