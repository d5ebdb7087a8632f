package ledgertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
)

// lineLog is a logger whose lines a test reads back.
type lineLog struct {
	t   testing.TB
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *lineLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return w.buf.Write(p)
}

// take returns the lines written since the last take.
func (w *lineLog) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := strings.TrimRight(w.buf.String(), "\n")
	w.buf.Reset()
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// timed records the time of every record it passes on.
type timed struct {
	slog.Handler
	mu    sync.Mutex
	times []time.Time
}

func (h *timed) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	h.times = append(h.times, r.Time)
	h.mu.Unlock()
	return h.Handler.Handle(ctx, r)
}

// last is the time of the last record.
func (h *timed) last() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.times) == 0 {
		return time.Time{}
	}
	return h.times[len(h.times)-1]
}

// testLogLater: a change whose log lines the caller took (AllocateRequest.LogLater,
// ReleaseLogLater) is durable when the call returns, but its line is written only by
// LogLines.Write, once, with the fields of the line written at once without it and the
// time its change became durable (not the time of the writing); an idempotent ADD or a
// failed change leaves no line; in a group commit every caller gets the lines of its
// own change only.
func testLogLater(t *testing.T, newStore Factory) {
	st, reopen := newStore(t)
	lines := &lineLog{t: t}
	clk := NewClock()
	times := &timed{Handler: slog.NewTextHandler(lines, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}})}
	opts := ledger.Options{Clock: clk, Logger: slog.New(times)}
	l, err := ledger.Open(st, opts) // not audited: the reopen below closes its store
	if err != nil {
		t.Fatal(err)
	}
	r := Ranges(t, `[[{"subnet":"10.7.0.0/28"}]]`)
	pod := ledger.Pod{Namespace: "ns", Name: "web", UID: "uid-1"}

	// written at once: the reference line
	now, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("now"), Pod: pod, Ranges: r})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := lines.take(), []string{fmt.Sprintf(`level=INFO msg=allocated attachment=net/now/eth0 ips=%v podUID=uid-1`, now.IPs)}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("allocation without LogLater: lines %q, want %q", got, want)
	}

	var later ledger.LogLines
	ls, existed, err := l.Allocate(ledger.AllocateRequest{Key: Key("later"), Pod: pod, Ranges: r, LogLater: &later})
	if err != nil || existed {
		t.Fatalf("allocate: %v (existed %v)", err, existed)
	}
	if got := lines.take(); len(got) != 0 {
		t.Errorf("allocation with LogLater wrote %q before Write", got)
	}
	committed := clk.Now()
	clk.Advance(time.Hour) // the line is written an hour after its change
	// idempotent and failed calls add nothing to later
	if _, existed, err := l.Allocate(ledger.AllocateRequest{Key: Key("later"), Pod: pod, Ranges: r, LogLater: &later}); err != nil || !existed {
		t.Fatalf("second allocate: %v (existed %v)", err, existed)
	}
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("conflict"), Ranges: Ranges(t, `[[{"subnet":"10.7.0.0/27"}]]`), LogLater: &later}); !errors.Is(err, ledger.ErrPoolConflict) {
		t.Fatalf("allocate with other ranges: %v, want ErrPoolConflict", err)
	}
	// durable before Write: a reopened store holds the lease
	Audit(t, l)
	l2 := Open(t, reopen(), opts)
	if got, ok := l2.Lease(Key("later")); !ok || fmt.Sprint(got.IPs) != fmt.Sprint(ls.IPs) {
		t.Errorf("after a reopen, before Write: lease %v %v, want %v", got.IPs, ok, ls.IPs)
	}
	lines.take() // the reopened ledger logs nothing itself; keep the check below exact
	later.Write()
	if got, want := lines.take(), []string{fmt.Sprintf(`level=INFO msg=allocated attachment=net/later/eth0 ips=%v podUID=uid-1`, ls.IPs)}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Write: lines %q, want %q", got, want)
	}
	if got := times.last(); !got.Equal(committed) {
		t.Errorf("the line written later is stamped %v, want %v (its change's time, not the writing's)", got, committed)
	}
	later.Write()
	if got := lines.take(); len(got) != 0 {
		t.Errorf("a second Write wrote %q again", got)
	}

	if _, ok, err := l2.ReleaseLogLater(Key("later"), ledger.ReasonDEL, "gone", &later); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	if _, ok, err := l2.ReleaseLogLater(Key("later"), ledger.ReasonDEL, "again", &later); err != nil || ok {
		t.Fatalf("second release: %v %v, want nothing released", ok, err)
	}
	if got := lines.take(); len(got) != 0 {
		t.Errorf("release with a later log wrote %q before Write", got)
	}
	later.Write()
	if got, want := lines.take(), []string{fmt.Sprintf(`level=INFO msg=released attachment=net/later/eth0 ips=%v reason=DEL detail=gone`, ls.IPs)}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Write after release: lines %q, want %q", got, want)
	}

	// a group commit: every caller holds its own line and no other
	const callers = 5
	laters := make([]ledger.LogLines, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			if _, _, err := l2.Allocate(ledger.AllocateRequest{Key: Key(fmt.Sprint("g", i)), Ranges: r, LogLater: &laters[i]}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := lines.take(); len(got) != 0 {
		t.Errorf("concurrent allocations with LogLater wrote %q before Write", got)
	}
	for i := range laters {
		laters[i].Write()
		got := lines.take()
		if len(got) != 1 || !strings.Contains(got[0], fmt.Sprintf("msg=allocated attachment=net/g%d/eth0 ", i)) {
			t.Errorf("caller %d: lines %q, want its own allocation only", i, got)
		}
	}
}
