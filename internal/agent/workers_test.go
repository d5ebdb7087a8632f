package agent_test

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
)

// workers counts the goroutines serving or waiting for connections.
func workers() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "agent.(*Server).work(")
}

// waitWorkers waits (up to 10s) until at most n workers remain and returns how many do.
func waitWorkers(n int) int {
	deadline := time.Now().Add(10 * time.Second)
	for {
		w := workers()
		if w <= n || time.Now().After(deadline) {
			return w
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConnectionWorkersEnd: a burst of concurrent calls is answered in full; after it
// at most 4 workers stay parked for the next calls, which they answer; once Serve
// has returned none is left.
func TestConnectionWorkersEnd(t *testing.T) {
	before := workers()
	s := serve(t, nil)
	const burst = 40
	var wg sync.WaitGroup
	errs := make(chan error, burst)
	for i := range burst {
		wg.Go(func() {
			if _, err := s.call(t, addReq(t, fmt.Sprint("burst-", i))); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("ADD in a burst: %v", err)
	}
	if w := waitWorkers(before + 4); w > before+4 {
		t.Errorf("%d connection workers after the burst, want at most 4 parked", w-before)
	}
	for i := range 10 {
		if _, err := s.call(t, api.Request{Version: api.Version, Op: api.OpDel, Network: "net", ContainerID: fmt.Sprint("burst-", i), IfName: "eth0"}); err != nil {
			t.Fatalf("DEL after the burst: %v", err)
		}
	}
	s.cancel()
	<-s.done
	if w := waitWorkers(before); w > before {
		t.Errorf("%d connection workers left after Serve returned", w-before)
	}
}
