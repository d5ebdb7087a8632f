package agent_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/spool"
	"github.com/ipledger/ipledger/internal/store/boltstore"
)

// newServer is a Server on a real bbolt ledger, driven through Handle (no socket);
// the ledger is audited when the test ends.
func newServer(t *testing.T, clk clock.Clock) (*agent.Server, *ledger.Ledger, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := boltstore.Open(filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() }) // after ledgertest's audit
	l := ledgertest.Open(t, st, ledger.Options{Clock: clk})
	spoolDir := filepath.Join(dir, "spool")
	s, err := agent.New(agent.Config{Ledger: l, Socket: filepath.Join(dir, "s.sock"), SpoolDir: spoolDir, Logger: ledgertest.TestLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return s, l, spoolDir
}

func addReq(t *testing.T, cid string) api.Request {
	return api.Request{Version: api.Version, Op: api.OpAdd, Network: "net", ContainerID: cid, IfName: "eth0",
		Ranges: ledgertest.Ranges(t, `[[{"subnet":"10.250.0.0/24"}]]`)}
}

// A DEL spooled while the agent was unreachable releases the lease that existed when
// it was spooled, and never one the attachment got after it (a runtime retrying ADD
// with the same container ID once the agent is back).
func TestSpoolReleasesOnlyOlderLeases(t *testing.T) {
	clock := ledgertest.NewClock()
	s, l, spoolDir := newServer(t, clock)
	ctx := context.Background()

	if r := s.Handle(ctx, addReq(t, "old")); r.Error != nil {
		t.Fatal(r.Error)
	}
	clock.Advance(time.Second)
	// Both DELs are spooled now; "reused" gets its ADD after that.
	spooledAt := clock.Now()
	for _, cid := range []string{"old", "reused"} {
		if err := spool.Write(spoolDir, spool.Entry{Key: ledgertest.Key(cid), Spooled: spooledAt, CNIVerb: "DEL"}); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(time.Second)
	if r := s.Handle(ctx, addReq(t, "reused")); r.Error != nil {
		t.Fatal(r.Error)
	}

	s.ApplySpool()

	if _, held := l.Lease(ledgertest.Key("old")); held {
		t.Error("the lease that existed when the DEL was spooled is still held")
	}
	if _, held := l.Lease(ledgertest.Key("reused")); !held {
		t.Error("a spooled DEL released a lease created after it was spooled")
	}
	n, err := spool.Apply(spoolDir, func(spool.Entry) error { return nil })
	if err != nil || n != 0 {
		t.Errorf("spool after apply: %d entries left, err %v; want none", n, err)
	}
}

// Requests of one attachment are serialized: concurrent ADDs of one attachment get
// one lease; ADD and DEL of unrelated attachments proceed in parallel and each ends
// as asked.
func TestConcurrentRequests(t *testing.T) {
	s, l, _ := newServer(t, nil) // the system clock
	ctx := context.Background()
	var wg sync.WaitGroup
	ips := make([]string, 16)
	for i := range ips {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := s.Handle(ctx, addReq(t, "same"))
			if r.Error != nil || r.Lease == nil {
				t.Errorf("ADD %d: %v", i, r.Error)
				return
			}
			ips[i] = r.Lease.IPs[0]
		}()
	}
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := addReq(t, fmt.Sprint("other", i))
			if r := s.Handle(ctx, req); r.Error != nil {
				t.Errorf("ADD: %v", r.Error)
			}
			if i%2 == 0 {
				req.Op = api.OpDel
				if r := s.Handle(ctx, req); r.Error != nil {
					t.Errorf("DEL: %v", r.Error)
				}
			}
		}()
	}
	wg.Wait()
	for _, ip := range ips {
		if ip != ips[0] {
			t.Fatalf("concurrent ADDs of one attachment got different addresses: %v", ips)
		}
	}
	if got := len(l.Leases("net")); got != 1+16 {
		t.Errorf("%d leases, want 17 (one for the repeated attachment, 16 of the others kept)", got)
	}
}
