package agent_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
)

// BenchmarkSocketAddDel: one ADD and one DEL through the agent's socket (connect,
// JSON, durable ledger change), without the plugin's exec; the agent's share of a
// CNI call.
func BenchmarkSocketAddDel(b *testing.B) {
	a := agentenv.Start(b, agentenv.Options{Args: []string{"--reuse-delay", "0s"}})
	sets := ledgertest.Ranges(b, `[[{"subnet":"10.248.0.0/22"}]]`)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req := api.Request{Op: api.OpAdd, Network: "bench", ContainerID: fmt.Sprint("c", i), IfName: "eth0", Ranges: sets}
		if _, err := a.Call(req); err != nil {
			b.Fatal(err)
		}
		req.Op = api.OpDel
		if _, err := a.Call(req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSocketBurst110: a burst of 110 concurrent ADDs (kubelet's max pods per
// node, as when a node starts), then 110 concurrent DELs, through the agent's socket
// without the plugin's exec: the agent's share of the bench's burst row, where
// requests wait on each other (group commits, the ledger's lock).
func BenchmarkSocketBurst110(b *testing.B) {
	a := agentenv.Start(b, agentenv.Options{Args: []string{"--reuse-delay", "0s"}})
	sets := ledgertest.Ranges(b, `[[{"subnet":"10.248.4.0/22"}]]`)
	const n = 110
	run := func(op string, round int) {
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := 0; i < n; i++ {
			wg.Go(func() {
				resp, err := a.Call(api.Request{Op: op, Network: "burst", ContainerID: fmt.Sprintf("b%d-%d", round, i), IfName: "eth0", Ranges: sets})
				if err == nil && resp.Error != nil {
					err = resp.Error
				}
				errs[i] = err
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		run(api.OpAdd, i)
		run(api.OpDel, i)
	}
}
