package cluster_test

import (
	"flag"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
)

// chaosAllocs sizes TestChaosProcesses and TestChaosFaults: small in `go test`
// (smaller under -short, see chaosSize), at least 100,000 when run by hand:
//
//	go test -run TestChaosProcesses -timeout 2h ./test/cluster -chaos.allocs 100000
var chaosAllocs = flag.Int("chaos.allocs", 3000, "allocations of TestChaosProcesses in all")

// chaosSize is n, the size a flag gives, except under -short when the flag named
// was not given: then short, the fast tier's size (every fault still happens).
func chaosSize(name string, n, short int) int {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	if testing.Short() && !given {
		return short
	}
	return n
}

// TestChaosProcesses: five agent processes on a three-member etcd cluster, churning
// (one in twenty operations through the plugin binary) in phases of 1,000
// allocations; every phase suffers one disruption, in turn: an agent SIGKILLed and
// restarted on its state, an etcd member SIGKILLed and restarted, an agent paused
// (SIGSTOP) for a second, under its lease, and resumed. After every phase the real
// cluster audit runs with the phase's last leases live (no address held twice, every
// lease in its node's block), and again after they are released; throughout, no ADD
// answers an address another live lease holds.
func TestChaosProcesses(t *testing.T) {
	sideBySideWhenShort(t)
	ec := etcdenv.StartCluster(t, 3)
	nodes := startNodes(t, 5, []string{"--datastore", "etcd", "--etcd-endpoints", strings.Join(ec.Endpoints(), ",")})
	allocs := chaosSize("chaos.allocs", *chaosAllocs, 600)
	perPhase := max(1, min(1000, allocs/3)) // at least the three disruptions
	phases := max(1, allocs/perPhase)
	var total, retries int64
	began := time.Now()
	for p := range phases {
		victim := nodes[p%len(nodes)]
		var what string
		disrupt := func() {}
		switch p % 3 {
		case 0:
			what = "agent " + victim.name + " SIGKILLed and restarted"
			disrupt = func() { victim.Kill(); time.Sleep(500 * time.Millisecond); victim.Restart() }
		case 1:
			i := p % ec.Size()
			what = fmt.Sprintf("etcd member %d SIGKILLed and restarted", i)
			disrupt = func() { ec.Kill(i); time.Sleep(2 * time.Second); ec.Restart(i) }
		case 2:
			what = "agent " + victim.name + " paused 1s (under its 3s lease)"
			disrupt = func() {
				pid := victim.PID()
				syscall.Kill(pid, syscall.SIGSTOP)
				time.Sleep(time.Second)
				syscall.Kill(pid, syscall.SIGCONT)
			}
		}
		st := churn(t, nodes, churnOpts{Allocations: perPhase, Workers: 2, Live: 10, PluginEvery: 20, Retry: 90 * time.Second, Prefix: fmt.Sprintf("p%d-", p)}, disrupt)
		rep := mustBalance(t, nodes)
		if want := 5 * 2 * 10; rep.Leases != want {
			t.Fatalf("phase %d (%s): the audit saw %d leases, want %d", p, what, rep.Leases, want)
		}
		st.releaseAll(t)
		if rep := mustBalance(t, nodes); rep.Leases != 0 {
			t.Fatalf("phase %d: %d leases left after the releases", p, rep.Leases)
		}
		total += st.adds.Load()
		retries += st.retries.Load()
		t.Logf("phase %d: %s; %d allocations so far", p, what, total)
	}
	noFalseReclaim(t, nodes)
	t.Logf("chaos: %d allocations and as many releases in %d phases, %v, %d retries; zero addresses held twice", total, phases, time.Since(began).Round(time.Second), retries)
}
