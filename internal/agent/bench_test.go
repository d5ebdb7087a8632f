package agent_test

import (
	"fmt"
	"testing"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
)

// BenchmarkSocketAddDel: one ADD and one DEL through the agent's socket (connect,
// JSON, durable ledger change), without the plugin's exec; the agent's share of a
// CNI call.
func BenchmarkSocketAddDel(b *testing.B) {
	a := agentenv.Start(b, agentenv.Options{Args: []string{"--reuse-delay", "0s"}})
	sets, err := pool.ParseRangeSets([]byte(`[[{"subnet":"10.248.0.0/22"}]]`))
	if err != nil {
		b.Fatal(err)
	}
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
