// Package agent is the node agent's server: it owns the ledger and answers the
// plugins and the CLI on a root-only unix socket, one request per connection,
// serializing requests per attachment while unrelated attachments proceed in parallel.
package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger"
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
	Ledger        *ledger.Ledger
	Socket        string
	SpoolDir      string
	SpoolInterval time.Duration // default 2s
	Guard         Guard
	Logger        *slog.Logger
	// DrainTimeout bounds how long shutdown waits for requests in flight; default 30s.
	DrainTimeout time.Duration
}

// Server serves the agent API.
type Server struct {
	cfg   Config
	log   *slog.Logger
	locks keyLocks
	wg    sync.WaitGroup
	stats *Stats
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
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, log: log, locks: keyLocks{m: map[ledger.Key]*keyLock{}}, stats: newStats()}, nil
}

// Stats are the server's counters, for metrics.
func (s *Server) Stats() *Stats { return s.stats }

// Listen removes a stale socket safely (only a socket nobody answers on) and listens
// with mode 0600.
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
			return nil, fmt.Errorf("--socket %s: another ipledgerd is serving on it; stop it first", path)
		}
		// Only a refused connection proves nobody listens; a timeout or a full
		// backlog may be a busy agent, whose socket must not be taken from it.
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("--socket %s exists and its owner could not be ruled out (%v); is another ipledgerd running? stop it, or remove the socket yourself", path, err)
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

// ApplySpool applies spooled DELs; it is called before serving and periodically.
func (s *Server) ApplySpool() {
	if s.cfg.SpoolDir == "" {
		return
	}
	n, err := spool.Apply(s.cfg.SpoolDir, func(e spool.Entry) error {
		// Serialized with requests of the same attachment, and only a lease that
		// existed when the DEL was spooled: an ADD answered after it keeps its lease.
		unlock := s.locks.lock(e.Key)
		defer unlock()
		_, _, err := s.cfg.Ledger.ReleaseCreatedBefore(e.Key, e.Spooled, ledger.ReasonDEL, "spooled DEL from "+e.Spooled.Format(time.RFC3339Nano))
		return err
	})
	if n > 0 {
		s.log.Info("applied spooled DELs", "count", n)
		s.stats.add("spool_applied", n)
	}
	if err != nil {
		s.log.Error("DEL spool", "err", err)
	}
}

// Serve applies the spool, then answers on ln until ctx is done; then it stops
// accepting, waits for requests in flight (at most DrainTimeout) and returns.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.ApplySpool()
	go func() {
		t := time.NewTicker(s.cfg.SpoolInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.ApplySpool()
			}
		}
	}()
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return err
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.handleConn(ctx, conn)
		}()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.cfg.DrainTimeout):
		s.log.Warn("drain timed out; requests still in flight")
	}
	s.ApplySpool()
	return nil
}

func (s *Server) handleConn(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(60 * time.Second))
	req, err := api.ReadRequest(bufio.NewReader(conn))
	var resp *api.Response
	if err != nil {
		resp = errResp(&api.Error{Code: api.CodeInvalid, Msg: err.Error()})
	} else {
		// requests in flight finish even when shutdown starts
		resp = s.Handle(context.WithoutCancel(ctx), req)
	}
	resp.Version = api.Version
	b, _ := api.MarshalResponse(resp) // json.Marshal's bytes, without reflection for ADD and DEL
	conn.Write(append(b, '\n'))
}

func errResp(e *api.Error) *api.Response { return &api.Response{Error: e} }

// errorOf maps ledger errors to API error codes.
func errorOf(err error) *api.Error {
	code := api.CodeInternal
	switch {
	case errors.Is(err, ledger.ErrPoolExhausted):
		code = api.CodeExhausted
	case errors.Is(err, ledger.ErrPoolConflict):
		code = api.CodeConflict
	case errors.Is(err, ledger.ErrInvalidAttachment), errors.Is(err, pool.ErrInvalidRange), errors.Is(err, ledger.ErrUnknownNetwork):
		code = api.CodeInvalid
	case errors.Is(err, ledger.ErrStore), errors.Is(err, ledger.ErrCorrupt):
		code = api.CodeStore
	}
	return &api.Error{Code: code, Msg: err.Error()}
}

// Handle answers one request.
func (s *Server) Handle(ctx context.Context, req api.Request) *api.Response {
	start := time.Now()
	if req.Version != api.Version {
		return errResp(&api.Error{Code: api.CodeInvalid, Msg: fmt.Sprintf("protocol version %d; this agent speaks %d: use plugin and agent binaries of one release", req.Version, api.Version)})
	}
	var resp *api.Response
	switch req.Op {
	case api.OpAdd:
		resp = s.add(ctx, req)
	case api.OpDel:
		resp = s.del(req)
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
		resp = s.release(req)
	case api.OpPing:
		resp = &api.Response{}
	default:
		resp = errResp(&api.Error{Code: api.CodeInvalid, Msg: fmt.Sprintf("op %q is not one of add, del, check, gc, status, leases, audit, history, release, ping", req.Op)})
	}
	s.stats.observe(req.Op, time.Since(start), resp.Error)
	return resp
}

func (s *Server) view(ls ledger.Lease) api.LeaseView {
	var ranges []pool.RangeSet
	if ps, err := s.cfg.Ledger.Pool(ls.Key.Network); err == nil {
		ranges = ps.Ranges
	}
	v := api.ViewOf(ls, ranges)
	if s.cfg.Guard != nil {
		s.cfg.Guard.Annotate(&v)
	}
	return v
}

func (s *Server) add(ctx context.Context, req api.Request) *api.Response {
	k := req.Key()
	if err := k.Validate(); err != nil {
		return errResp(errorOf(err))
	}
	if len(req.Ranges) == 0 {
		return errResp(&api.Error{Code: api.CodeInvalid, Msg: "ipam.ranges: missing; give the network's ranges"})
	}
	unlock := s.locks.lock(k)
	defer unlock()
	areq := ledger.AllocateRequest{Key: k, Pod: req.Pod, NetNS: req.NetNS, Ranges: req.Ranges}
	if req.Pod.UID != "" && s.cfg.Guard != nil {
		if _, held := s.cfg.Ledger.Lease(k); !held {
			var olds []ledger.Lease
			for _, ls := range s.cfg.Ledger.LeasesOfPod(k.Network, req.Pod.UID) {
				if ls.Key != k && ls.Key.IfName == k.IfName {
					olds = append(olds, ls)
				}
			}
			if len(olds) > 0 {
				areq.Supersede = s.cfg.Guard.Supersedable(ctx, olds)
			}
		}
	}
	ls, existed, err := s.cfg.Ledger.Allocate(areq)
	if err != nil {
		return errResp(errorOf(err))
	}
	v := s.view(ls)
	return &api.Response{Lease: &v, Existed: existed}
}

func (s *Server) del(req api.Request) *api.Response {
	k := req.Key()
	if err := k.Validate(); err != nil {
		return errResp(errorOf(err))
	}
	unlock := s.locks.lock(k)
	defer unlock()
	_, ok, err := s.cfg.Ledger.Release(k, ledger.ReasonDEL, req.Detail)
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
	k := req.Key()
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
	var released int
	for _, ls := range drop {
		unlock := s.locks.lock(ls.Key)
		_, ok, err := s.cfg.Ledger.ReleaseIfCreated(ls.Key, ls.Created, ledger.ReasonGC, "not in cni.dev/valid-attachments")
		unlock()
		if err != nil {
			return errResp(errorOf(err))
		}
		if ok {
			released++
		}
	}
	return &api.Response{Released: released}
}

func (s *Server) status(req api.Request) *api.Response {
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
	if !ps.Available {
		return &api.Response{Pool: &ps, Error: &api.Error{Code: api.CodeExhausted, Msg: fmt.Sprintf("network %q: no address can be allocated now (%d in use, %d waiting out the reuse delay)", req.Network, ps.InUse, ps.Free)}}
	}
	return &api.Response{Pool: &ps}
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
	a := &api.Audit{Live: rep.Live, DoubleAssigned: len(rep.DoubleAssigned), Doubles: rep.DoubleAssigned, Problems: rep.Problems, Pools: rep.Pools, Runtime: "none"}
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
	return &api.Response{History: h}
}

func (s *Server) release(req api.Request) *api.Response {
	k := req.Key()
	if err := k.Validate(); err != nil {
		return errResp(errorOf(err))
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
