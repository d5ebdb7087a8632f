package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/boltstore"
)

// flakyListener is a real unix listener whose Accept fails with injected errors:
// queued ones before the next real Accept, or ones armed to replace the next
// connection (which is closed), as a process out of file descriptors sees.
type flakyListener struct {
	net.Listener
	mu     sync.Mutex
	queued []error
	armed  []error
}

func acceptErr(errno syscall.Errno) error {
	return &net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", errno)}
}

func (f *flakyListener) Accept() (net.Conn, error) {
	f.mu.Lock()
	if len(f.queued) > 0 {
		err := f.queued[0]
		f.queued = f.queued[1:]
		f.mu.Unlock()
		return nil, err
	}
	f.mu.Unlock()
	c, err := f.Listener.Accept()
	if err != nil {
		return c, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.armed) > 0 {
		c.Close()
		err := f.armed[0]
		f.queued, f.armed = f.armed[1:], nil
		return nil, err
	}
	return c, nil
}

func (f *flakyListener) arm(errs ...error) {
	f.mu.Lock()
	f.armed = errs
	f.mu.Unlock()
}

// blockingGuard holds every supersession check until release is closed.
type blockingGuard struct {
	entered chan struct{}
	release chan struct{}
}

func (g *blockingGuard) Supersedable(ctx context.Context, olds []ledger.Lease) []ledger.Key {
	g.entered <- struct{}{}
	<-g.release
	return nil
}
func (g *blockingGuard) MayRelease(context.Context, ledger.Lease) bool { return true }

var _ agent.Guard = (*blockingGuard)(nil)

type served struct {
	srv    *agent.Server
	l      *ledger.Ledger
	ln     *flakyListener
	socket string
	spool  string // the agent's spool directory
	cancel context.CancelFunc
	done   chan struct{} // closed when Serve returned, with err
	err    error
}

// serve runs a Server on a real socket and bbolt ledger; the ledger is closed only
// after Serve returned, as ipledgerd does.
func serve(t *testing.T, mut func(*agent.Config), queued ...error) *served {
	t.Helper()
	return serveLedger(t, ledger.Options{}, mut, queued...)
}

// serveLedger is serve with the ledger opened with opts.
func serveLedger(t *testing.T, opts ledger.Options, mut func(*agent.Config), queued ...error) *served {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "ipl-agent-") // unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	st, err := boltstore.Open(filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() }) // last: after Serve returned and the audit
	l := ledgertest.Open(t, st, opts)
	cfg := agent.Config{Ledger: l, Socket: filepath.Join(dir, "s.sock"), SpoolDir: filepath.Join(dir, "spool"), Logger: ledgertest.TestLogger(t)}
	if mut != nil {
		mut(&cfg)
	}
	srv, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := agent.Listen(cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{srv: srv, l: l, ln: &flakyListener{Listener: inner, queued: queued}, socket: cfg.Socket, spool: cfg.SpoolDir, cancel: cancel, done: make(chan struct{})}
	go func() { s.err = srv.Serve(ctx, s.ln); close(s.done) }()
	t.Cleanup(func() { s.stop(t) })
	return s
}

// stop ends Serve and waits for it to return (again: at once).
func (s *served) stop(t *testing.T) {
	t.Helper()
	s.cancel()
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		t.Error("Serve did not return 30s after its context ended")
	}
}

func (s *served) call(t *testing.T, req api.Request) (*api.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return api.Call(ctx, s.socket, req)
}

func (s *served) running(t *testing.T) {
	t.Helper()
	select {
	case <-s.done:
		t.Fatalf("Serve returned (%v) while it should serve", s.err)
	default:
	}
}

// Accept errors that are the moment's trouble (out of file descriptors, a connection
// aborted before it was accepted) do not end Serve: it backs off and serves on.
func TestServeSurvivesAcceptErrors(t *testing.T) {
	s := serve(t, nil, acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE), acceptErr(syscall.ENFILE),
		acceptErr(syscall.ECONNABORTED), acceptErr(syscall.EMFILE))
	if _, err := s.call(t, addReq(t, "after-emfile")); err != nil {
		t.Fatalf("ADD after Accept errors: %v", err)
	}
	s.running(t)
	if got := s.srv.Stats().Counter(agent.CounterAcceptErrors); got != 5 {
		t.Errorf("accept_errors = %d, want 5", got)
	}
}

// Shutdown and Accept errors never end Serve under a request in flight: the ledger
// (closed by the caller once Serve returns) is never closed under it.
func TestServeWaitsForRequestsInFlight(t *testing.T) {
	g := &blockingGuard{entered: make(chan struct{}, 1), release: make(chan struct{})}
	s := serve(t, func(c *agent.Config) { c.Guard = g; c.DrainTimeout = 50 * time.Millisecond })
	pod := api.Pod{Namespace: "ns", Name: "p", UID: "uid-1"}
	first := addReq(t, "sandbox1")
	first.Pod = pod
	if _, err := s.call(t, first); err != nil {
		t.Fatal(err)
	}
	// a re-created sandbox of the same pod: the agent asks the guard, which holds it
	second := addReq(t, "sandbox2")
	second.Pod = pod
	answered := make(chan error, 1)
	go func() { _, err := s.call(t, second); answered <- err }()
	<-g.entered

	// out of file descriptors while the request is in flight
	s.ln.arm(acceptErr(syscall.EMFILE))
	if c, err := net.Dial("unix", s.socket); err == nil {
		defer c.Close()
	}
	time.Sleep(200 * time.Millisecond)
	s.running(t)

	// shutdown while the request is in flight: Serve waits past DrainTimeout
	s.cancel()
	time.Sleep(200 * time.Millisecond)
	s.running(t)

	close(g.release)
	if err := <-answered; err != nil {
		t.Fatalf("the request in flight at shutdown failed: %v", err)
	}
	select {
	case <-s.done:
		if s.err != nil {
			t.Fatalf("Serve after shutdown: %v", s.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after the last request")
	}
	if _, held := s.l.Lease(ledgertest.Key("sandbox2")); !held {
		t.Fatal("the ADD answered during shutdown holds no lease")
	}
}

// A request larger than api.MaxRequest is refused with an error that says so, and
// the agent goes on serving.
func TestOversizedRequestRefused(t *testing.T) {
	s := serve(t, nil)
	req := addReq(t, "big")
	req.Detail = strings.Repeat("x", api.MaxRequest+1)
	_, err := s.call(t, req)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeInvalid || !strings.Contains(ae.Msg, "too large") || !strings.Contains(ae.Msg, fmt.Sprint(api.MaxRequest)) {
		t.Fatalf("oversized request: %v; want an invalid-request error saying it is too large and naming the bound", err)
	}
	if _, err := s.call(t, addReq(t, "small")); err != nil {
		t.Fatalf("ADD after an oversized request: %v", err)
	}
	if _, held := s.l.Lease(ledgertest.Key("big")); held {
		t.Fatal("the oversized request was applied")
	}
}

// Clients that connect and send nothing cannot starve a real ADD: connections are
// bounded, and when all slots are taken the oldest connection still waiting for its
// request makes room.
func TestIdleConnectionsDoNotStarveAdd(t *testing.T) {
	const slots = 4
	s := serve(t, func(c *agent.Config) { c.MaxConns = slots; c.ReadTimeout = time.Minute })
	var idle []net.Conn
	for range 5 * slots {
		c, err := net.Dial("unix", s.socket)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	t.Cleanup(func() {
		for _, c := range idle {
			c.Close()
		}
	})
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := api.Call(ctx, s.socket, addReq(t, "real")); err != nil {
		t.Fatalf("ADD behind %d idle connections (%d slots, read timeout 1m): %v", len(idle), slots, err)
	}
	t.Logf("ADD answered %v after %d idle connections; %d evicted", time.Since(start), len(idle), s.srv.Stats().Counter(agent.CounterConnsEvicted))
	if got := s.srv.Stats().Counter(agent.CounterConnsEvicted); got < uint64(len(idle)-slots) {
		t.Errorf("conns_evicted = %d; want at least %d (the server held more than %d connections)", got, len(idle)-slots, slots)
	}
}

// A connection that sends no request is closed after ReadTimeout.
func TestIdleConnectionClosed(t *testing.T) {
	s := serve(t, func(c *agent.Config) { c.ReadTimeout = 100 * time.Millisecond })
	c, err := net.Dial("unix", s.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("idle connection: read %d, %v; want the agent to close it (EOF)", n, err)
	}
}

// Op strings the agent does not know share one metric label, "unknown": no client
// can create metric series.
func TestUnknownOpsOneSeries(t *testing.T) {
	s, _, _ := newServer(t, nil)
	for i := range 50 {
		r := s.Handle(context.Background(), api.Request{Version: api.Version, Op: fmt.Sprint("bogus-op-", i)})
		if r.Error == nil || r.Error.Code != api.CodeInvalid {
			t.Fatalf("unknown op answered %+v", r)
		}
	}
	mustAdd(t, s, "known")
	rec := httptest.NewRecorder()
	s.HTTPHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	var series []string
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(line, "ipledger_requests_total{") {
			series = append(series, line)
		}
	}
	text := strings.Join(series, "\n")
	if strings.Contains(text, "bogus") || strings.Count(text, `verb="unknown"`) != 1 || !strings.Contains(text, `result="invalid",verb="unknown"} 50`) || !strings.Contains(text, `verb="add"`) {
		t.Fatalf("request series:\n%s\nwant one verb=\"unknown\" series counting 50, no client strings", text)
	}
}

// More ranges than api.MaxRanges are refused before the ledger checks them.
func TestTooManyRangesRefused(t *testing.T) {
	s, l, _ := newServer(t, nil)
	var rs []string
	for i := range api.MaxRanges + 1 {
		rs = append(rs, fmt.Sprintf(`{"subnet":"10.%d.%d.0/24"}`, 100+i/256, i%256))
	}
	req := addReq(t, "many")
	req.Ranges = ledgertest.Ranges(t, "[["+strings.Join(rs, ",")+"]]")
	r := s.Handle(context.Background(), req)
	if r.Error == nil || r.Error.Code != api.CodeInvalid || !strings.Contains(r.Error.Msg, "ipam.ranges") || !strings.Contains(r.Error.Msg, fmt.Sprint(api.MaxRanges)) {
		t.Fatalf("ADD with %d ranges: %+v; want an invalid-request error naming ipam.ranges and the bound", api.MaxRanges+1, r.Error)
	}
	if len(l.Pools()) != 0 {
		t.Fatal("a pool was created from a refused request")
	}
}
