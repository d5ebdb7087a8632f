package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/spool"
	"github.com/ipledger/ipledger/internal/store/boltstore"
)

// syncBuf collects log output from several goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuf) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuf) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestServedRequestsLogTheirChanges: ADDs and DELs answered over a real socket (the
// agent answers first and logs after) still write one info line per change with the
// fields operators read: the attachment, its addresses, the pod UID of an allocation,
// the reason and detail of a release, a spooled DEL applied by an ADD included. Every
// line is written by the time Serve has drained.
func TestServedRequestsLogTheirChanges(t *testing.T) {
	dir, err := os.MkdirTemp("/tmp", "ipl-agent-") // unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	st, err := boltstore.Open(filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var out syncBuf
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	l := ledgertest.Open(t, st, ledger.Options{Logger: log})
	spoolDir := filepath.Join(dir, "spool")
	cfg := agent.Config{Ledger: l, Socket: filepath.Join(dir, "s.sock"), SpoolDir: spoolDir, Logger: log}
	srv, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := agent.Listen(cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Serve did not return 30s after its context ended")
		}
	}
	t.Cleanup(stop)
	call := func(req api.Request) *api.Response {
		t.Helper()
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		resp, err := api.Call(cctx, cfg.Socket, req)
		if err != nil {
			t.Fatalf("%s %s: %v", req.Op, req.ContainerID, err)
		}
		return resp
	}

	add := addReq(t, "c1")
	add.Pod = ledger.Pod{Namespace: "ns", Name: "web", UID: "uid-1"}
	first := call(add)
	del := api.Request{Version: api.Version, Op: api.OpDel, Network: "net", ContainerID: "c1", IfName: "eth0", Detail: "by test"}
	if r := call(del); r.Released != 1 {
		t.Fatalf("DEL released %d, want 1", r.Released)
	}
	second := call(add)
	if err := spool.Write(spoolDir, spool.Entry{Key: ledgertest.Key("c1"), Spooled: time.Now(), CNIVerb: "DEL"}); err != nil {
		t.Fatal(err)
	}
	third := call(add) // applies the spooled DEL of c1 first, then allocates
	stop()

	ips := func(r *api.Response) string { return "[" + strings.Join(r.Lease.IPs, " ") + "]" }
	want := []string{
		fmt.Sprintf("level=INFO msg=allocated attachment=net/c1/eth0 ips=%s podUID=uid-1", ips(first)),
		fmt.Sprintf("level=INFO msg=released attachment=net/c1/eth0 ips=%s reason=DEL detail=\"by test\"", ips(first)),
		fmt.Sprintf("level=INFO msg=allocated attachment=net/c1/eth0 ips=%s podUID=uid-1", ips(second)),
		fmt.Sprintf("level=INFO msg=released attachment=net/c1/eth0 ips=%s reason=DEL detail=\"spooled DEL (plugin clock ", ips(second)),
		fmt.Sprintf("level=INFO msg=allocated attachment=net/c1/eth0 ips=%s podUID=uid-1", ips(third)),
	}
	var got []string
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.Contains(line, "msg=allocated") || strings.Contains(line, "msg=released") {
			got = append(got, line)
		}
	}
	t.Logf("log:\n%s", out.String())
	if len(got) != len(want) {
		t.Fatalf("%d change lines, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("line %d: %q, want it to start with %q", i, got[i], want[i])
		}
	}
}
