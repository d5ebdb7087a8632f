package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/spool"
)

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
	bg.Go(func() {
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
	})
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

// handleConn reads one request, counts it in the metrics, answers it, and then writes
// what need not delay the answer: the ledger's log lines of the request's changes
// (durable before the answer either way; the line reports the change, it is not its
// record).
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
		// counted before the answer: a scrape made after a caller has its answer
		// sees the request
		if counted {
			s.stats.observe(opLabel(req.Op), time.Since(start), resp)
		}
		s.answer(conn, resp)
		later.Write()
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
