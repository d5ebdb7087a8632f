package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/ledgerview"
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
	if err := os.Mkdir(spoolDir, 0o700); err != nil {
		t.Fatal(err)
	}
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

func mustAdd(t *testing.T, s *agent.Server, cid string) *api.Response {
	t.Helper()
	r := s.Handle(context.Background(), addReq(t, cid))
	if r.Error != nil || r.Lease == nil {
		t.Fatalf("ADD %s: %+v", cid, r.Error)
	}
	return r
}

func spoolDel(t *testing.T, dir, cid string, at time.Time) {
	t.Helper()
	if err := spool.Write(dir, spool.Entry{Key: ledgerview.Key(ledgertest.Key(cid)), Spooled: at, CNIVerb: "DEL"}); err != nil {
		t.Fatal(err)
	}
}

// A DEL spooled while the agent is up (its listen backlog full, or racing the
// start-up spool pass), then an ADD of the same attachment: the ADD must not answer
// the lease the DEL was meant for, and no later spool pass may release the lease the
// ADD answered. The runtime sent the DEL before the ADD, so the DEL is applied first.
func TestSpooledDelThenAddKeepsTheAddsLease(t *testing.T) {
	clk := clocktest.New()
	s, l, spoolDir := newServer(t, clk)
	first := mustAdd(t, s, "c1")
	clk.Advance(time.Second)
	spoolDel(t, spoolDir, "c1", clk.Now())
	clk.Advance(time.Second)

	second := mustAdd(t, s, "c1")
	if second.Existed {
		t.Fatalf("ADD after a spooled DEL answered the lease the DEL released (%v) as existing", first.Lease.IPs)
	}
	if n := spool.Len(spoolDir); n != 0 {
		t.Fatalf("the ADD left the spooled DEL in the spool (%d entries)", n)
	}
	ip := netip.MustParsePrefix(first.Lease.IPs[0]).Addr()
	h, err := l.History("net", ip)
	if err != nil || len(h) != 1 || h[0].Reason != ledger.ReasonDEL {
		t.Fatalf("history of %s = %+v, %v; want one release, reason DEL (the spooled DEL)", ip, h, err)
	}

	s.ApplySpool()
	ls, held := l.Lease(ledgertest.Key("c1"))
	if !held || ls.IPs[0].String() != second.Lease.IPs[0] {
		t.Fatalf("after the spool pass c1 holds %v (held %v); the ADD answered %v", ls.IPs, held, second.Lease.IPs)
	}
	if got := s.Stats().Counter(agent.CounterSpoolApplied); got != 1 {
		t.Errorf("spool_applied = %d, want 1", got)
	}
}

// Spooled DELs are ordered against ADDs without any clock: with the wall clock
// stepped an hour either way between the spool and its application, every
// acknowledged DEL is applied and no lease handed out after it is released.
func TestSpoolOrderSurvivesClockSteps(t *testing.T) {
	for _, step := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(step.String(), func(t *testing.T) {
			clk := clocktest.New()
			s, l, spoolDir := newServer(t, clk)
			mustAdd(t, s, "gone")        // its DEL is spooled while the agent is down
			old := mustAdd(t, s, "back") // its DEL is spooled, then it is ADDed again
			clk.Advance(time.Second)

			// the plugin's clock is off by step when it spools; then it is corrected
			clk.Step(step)
			spoolDel(t, spoolDir, "gone", clk.Now())
			spoolDel(t, spoolDir, "back", clk.Now())
			clk.Step(-step)
			clk.Advance(time.Second)

			again := mustAdd(t, s, "back")
			if again.Existed {
				t.Errorf("ADD answered the lease %v a spooled DEL was meant for", old.Lease.IPs)
			}
			s.ApplySpool()

			if _, held := l.Lease(ledgertest.Key("gone")); held {
				t.Error("an acknowledged spooled DEL was dropped: its lease is still held")
			}
			ls, held := l.Lease(ledgertest.Key("back"))
			if !held || ls.IPs[0].String() != again.Lease.IPs[0] {
				t.Errorf("the lease answered after the DEL was spooled is gone (held %v, %v)", held, ls.IPs)
			}
			if n := spool.Len(spoolDir); n != 0 {
				t.Errorf("%d spooled DELs left", n)
			}
		})
	}
}

// A spooled DEL that matches no lease (the attachment was released since, or never
// had one) is logged and counted, and removed.
func TestSpoolUnmatchedCounted(t *testing.T) {
	s, l, spoolDir := newServer(t, nil)
	mustAdd(t, s, "live")
	spoolDel(t, spoolDir, "never", time.Now())
	spoolDel(t, spoolDir, "live", time.Now())
	s.ApplySpool()
	if got := s.Stats().Counter(agent.CounterSpoolUnmatched); got != 1 {
		t.Errorf("spool_unmatched = %d, want 1", got)
	}
	if got := s.Stats().Counter(agent.CounterSpoolApplied); got != 2 {
		t.Errorf("spool_applied = %d, want 2", got)
	}
	if _, held := l.Lease(ledgertest.Key("live")); held || spool.Len(spoolDir) != 0 {
		t.Errorf("after the pass: live held %v, %d entries left", held, spool.Len(spoolDir))
	}
}

// Spool passes race with ADDs and spooled DELs of the same attachments: whatever the
// interleaving, a lease an ADD answered after the last DEL of its attachment was
// spooled is never released by the spool.
func TestSpoolPassRacesAdds(t *testing.T) {
	s, l, spoolDir := newServer(t, nil)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				s.ApplySpool()
			}
		}
	})
	const cids = 4
	for round := range 50 {
		answered := map[string]string{}
		for i := range cids {
			cid := fmt.Sprint("r", i)
			mustAdd(t, s, cid)
			spoolDel(t, spoolDir, cid, time.Now()) // the runtime's DEL, spooled
			answered[cid] = mustAdd(t, s, cid).Lease.IPs[0]
		}
		s.ApplySpool()
		for cid, ip := range answered {
			ls, held := l.Lease(ledgertest.Key(cid))
			if !held || ls.IPs[0].String() != ip {
				t.Fatalf("round %d: %s was answered %s after its DEL was spooled; it now holds %v (held %v)", round, cid, ip, ls.IPs, held)
			}
		}
	}
	close(stop)
	wg.Wait()
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
		wg.Go(func() {
			r := s.Handle(ctx, addReq(t, "same"))
			if r.Error != nil || r.Lease == nil {
				t.Errorf("ADD %d: %v", i, r.Error)
				return
			}
			ips[i] = r.Lease.IPs[0]
		})
	}
	for i := 0; i < 32; i++ {
		wg.Go(func() {
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
		})
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

// failingStore is a real bbolt store whose transactions fail when they delete the
// lease of one attachment, as a disk error during that release would.
type failingStore struct {
	ledger.Store
	fail ledger.Key
}

func (f *failingStore) Update(fn func(ledger.Tx) error) error {
	return f.Store.Update(func(tx ledger.Tx) error { return fn(failingTx{tx, f.fail}) })
}

type failingTx struct {
	ledger.Tx
	fail ledger.Key
}

func (f failingTx) DeleteLease(k ledger.Key) error {
	if k == f.fail {
		return fmt.Errorf("%w: injected write error deleting %s", ledger.ErrStore, k)
	}
	return f.Tx.DeleteLease(k)
}

// A GC whose first release fails goes on with the others and reports every failure
// (the CNI spec: collect as much as possible, return an aggregated error).
func TestGCContinuesAfterAFailedRelease(t *testing.T) {
	dir := t.TempDir()
	st, err := boltstore.Open(filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	fs := &failingStore{Store: st, fail: ledgertest.Key("a-fails")}
	l := ledgertest.Open(t, fs, ledger.Options{})
	s, err := agent.New(agent.Config{Ledger: l, Socket: filepath.Join(dir, "s.sock"), Logger: ledgertest.TestLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	for _, cid := range []string{"a-fails", "b-stale", "c-stale", "d-valid"} {
		mustAdd(t, s, cid)
	}
	r := s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpGC, Network: "net", Valid: []api.Attachment{{ContainerID: "d-valid", IfName: "eth0"}}})
	if r.Error == nil || r.Error.Code != api.CodeStore || !strings.Contains(r.Error.Msg, "net/a-fails/eth0") || !strings.Contains(r.Error.Msg, "injected write error") {
		t.Fatalf("GC with one failing release answered %+v; want a store error naming the failed attachment", r.Error)
	}
	if r.Released != 2 {
		t.Errorf("GC released %d, want 2 (it must go on after the failure)", r.Released)
	}
	var held []string
	for _, ls := range l.Leases("net") {
		held = append(held, ls.Key.ContainerID)
	}
	if strings.Join(held, ",") != "a-fails,d-valid" {
		t.Fatalf("after GC the ledger holds %v; want the failed one and the valid one", held)
	}
}

// Bad spool entries beyond spool.MaxRejected make the agent remove the oldest
// rejected ones: counted (spool_rejected_dropped) beside the rejections, and a good
// entry is applied all the same.
func TestSpoolRejectedDroppedCounted(t *testing.T) {
	s, l, spoolDir := newServer(t, nil)
	mustAdd(t, s, "live")
	spoolDel(t, spoolDir, "live", time.Now())
	const extra = 3
	for i := range spool.MaxRejected + extra {
		if err := os.WriteFile(filepath.Join(spoolDir, fmt.Sprintf("bad%03d.del", i)), []byte("{garbage"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s.ApplySpool()
	if got := s.Stats().Counter(agent.CounterSpoolRejected); got != spool.MaxRejected+extra {
		t.Errorf("spool_rejected = %d, want %d", got, spool.MaxRejected+extra)
	}
	if got := s.Stats().Counter(agent.CounterSpoolRejectedDropped); got != extra {
		t.Errorf("spool_rejected_dropped = %d, want %d", got, extra)
	}
	if _, held := l.Lease(ledgertest.Key("live")); held || spool.Len(spoolDir) != 0 {
		t.Errorf("after the pass: live held %v, %d entries left", held, spool.Len(spoolDir))
	}
}
