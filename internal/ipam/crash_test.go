package ipam_test

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ipledger/ipledger/internal/spool"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// TestAgentKilledDuringBurst SIGKILLs ipledgerd while ADDs and DELs run, keeps them
// running while it is down, and restarts it: every DEL answered success is applied
// (those answered while the agent was down through the spool), every ADD answered
// success still holds the address it was given, no address is held twice, and the
// ledger's audit passes.
func TestAgentKilledDuringBurst(t *testing.T) {
	const olds, workers, killAfter = 40, 6, 40
	e := newEnv(t, agentenv.Options{})
	nsPath := netenv.Namespace(t, "ipl").Path
	l := e.list("1.0.0", "crash", `[[{"subnet":"10.80.0.0/24"}]]`)
	c := ctx(t)
	for i := range olds {
		if _, err := e.cni.AddNetworkList(c, l, rt(fmt.Sprintf("old%02d", i), nsPath)); err != nil {
			t.Fatal(err)
		}
	}

	type op struct {
		del bool
		id  string
	}
	var ops []op
	for i := range olds {
		ops = append(ops, op{true, fmt.Sprintf("old%02d", i)}, op{false, fmt.Sprintf("new%02da", i)}, op{false, fmt.Sprintf("new%02db", i)})
	}
	var (
		mu      sync.Mutex
		delOK   = map[string]bool{}
		delErr  = map[string]error{}
		addOK   = map[string][]string{}
		addErr  = map[string]error{}
		done    atomic.Int64
		killed  = make(chan struct{})
		killOne sync.Once
		wg      sync.WaitGroup
		queue   = make(chan op)
	)
	for range workers {
		wg.Go(func() {
			for o := range queue {
				if o.del {
					err := e.cni.DelNetworkList(c, l, rt(o.id, ""))
					mu.Lock()
					if err == nil {
						delOK[o.id] = true
					} else {
						delErr[o.id] = err
					}
					mu.Unlock()
				} else {
					res, err := e.cni.AddNetworkList(c, l, rt(o.id, nsPath))
					mu.Lock()
					if err == nil {
						addOK[o.id] = resultIPs(t, res)
					} else {
						addErr[o.id] = err
					}
					mu.Unlock()
				}
				if done.Add(1) == killAfter {
					killOne.Do(func() {
						go func() { e.a.Kill(); close(killed) }()
					})
				}
			}
		})
	}
	for i, o := range ops {
		if i == killAfter+workers {
			<-killed // the rest runs against a dead agent
		}
		queue <- o
	}
	close(queue)
	wg.Wait()
	<-killed

	for id, err := range delErr {
		t.Errorf("DEL %s failed (a runtime may swallow it and leak the address): %v", id, err)
	}
	for id, err := range addErr {
		ce := cniError(t, err)
		t.Logf("ADD %s failed: code %d %s", id, ce.Code, ce.Msg)
	}
	spooled := spool.Len(e.a.SpoolDir)
	if spooled == 0 {
		t.Fatal("no DEL was spooled while the agent was down; the test did not exercise the spool")
	}
	t.Logf("%d DELs ok (%d spooled), %d ADDs ok, %d ADDs failed", len(delOK), spooled, len(addOK), len(addErr))

	e.a.Restart()
	if n := spool.Len(e.a.SpoolDir); n != 0 {
		t.Fatalf("%d spooled DELs left after restart", n)
	}
	leases := e.a.Leases(t)
	for id := range delOK {
		if ips := ipsOf(leases, "crash", id); ips != nil {
			t.Errorf("DEL of %s answered success, but it still holds %v", id, ips)
		}
	}
	for id, ips := range addOK {
		if held := ipsOf(leases, "crash", id); !slices.Equal(held, ips) {
			t.Errorf("ADD of %s answered %v, the ledger holds %v", id, ips, held)
		}
	}
	seen := map[string]string{}
	for _, ls := range leases {
		for _, ip := range ls.IPs {
			if other, dup := seen[ip]; dup {
				t.Errorf("%s held by %s and %s", ip, other, ls.ContainerID)
			}
			seen[ip] = ls.ContainerID
		}
	}
	if a := e.a.Audit(t); !a.OK || a.DoubleAssigned != 0 {
		t.Fatalf("audit after restart: %+v", a)
	}

	// the runtime retries the ADDs that failed: they get fresh, distinct addresses
	for id, err := range addErr {
		if ce := cniError(t, err); ce.Code != types.ErrTryAgainLater {
			t.Errorf("ADD %s failed with code %d, want 11 (agent down or died with the ADD in flight)", id, ce.Code)
		}
		res, err := e.cni.AddNetworkList(c, l, rt(id, nsPath))
		if err != nil {
			t.Fatalf("retried ADD %s: %v", id, err)
		}
		ip := resultIPs(t, res)[0]
		if other, dup := seen[ip]; dup && other != id {
			t.Fatalf("retried ADD %s got %s, held by %s", id, ip, other)
		}
		seen[ip] = id
	}
	if a := e.a.Audit(t); !a.OK || a.DoubleAssigned != 0 {
		t.Fatalf("audit after retries: %+v", a)
	}
}
