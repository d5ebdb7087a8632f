package kubeds_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// TestWatchOutlivesTheServersRequestTimeout: the apiserver ends every watch
// after its request timeout (here 2-4 s instead of 30-60 min); the Watch
// resumes from the last revision it saw, so a caller watching for 12 s sees
// every change once, in order, and the watch is still running.
func TestWatchOutlivesTheServersRequestTimeout(t *testing.T) {
	e := startEnv(t, kubeenv.APIServerOptions{Args: []string{"--min-request-timeout=2"}})
	s := e.store(t)
	ctx := ctxT(t)
	const key = "pools/counter"
	rev, err := s.Create(ctx, key, []byte(`{"n":0}`))
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	w, err := s.Watch(wctx, "pools/", rev)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for t0 := time.Now(); time.Since(t0) < 12*time.Second; {
		n++
		if rev, err = s.Update(ctx, key, []byte(fmt.Sprintf(`{"n":%d}`, n)), rev); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	last := int64(0)
	for i := 1; i <= n; i++ {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				t.Fatalf("watch ended after %d of %d changes: %v", i-1, n, w.Err())
			}
			m, err := counter(ev.KV.Value)
			if err != nil {
				t.Fatal(err)
			}
			if m != i || ev.KV.Revision <= last {
				t.Fatalf("change %d: counter %d at revision %d after %d (a gap or a duplicate)", i, m, ev.KV.Revision, last)
			}
			last = ev.KV.Revision
		case <-time.After(time.Minute):
			t.Fatalf("no change %d of %d within a minute", i, n)
		}
	}
	t.Logf("%d changes over 12 s seen once each, in order", n)
	select {
	case ev, ok := <-w.Events():
		if ok {
			t.Fatalf("an extra event: %+v", ev)
		}
		t.Fatalf("watch ended: %v", w.Err())
	case <-time.After(3 * time.Second):
	}
}
