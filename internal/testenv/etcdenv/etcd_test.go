package etcdenv_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
)

// TestClusterKillRestart: the leader SIGKILLed by Kill is gone (its PID no longer
// exists) while the other two elect a new leader and accept writes; Restart brings
// it back, it catches up (the cleanup audit compares every member's keyspace hash),
// and Stop leaves no process behind.
func TestClusterKillRestart(t *testing.T) {
	cl := etcdenv.StartCluster(t, 3)
	if cl.Size() != 3 || len(cl.Endpoints()) != 3 {
		t.Fatalf("cluster of %d members, endpoints %v", cl.Size(), cl.Endpoints())
	}
	cli := cl.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A put may time out while a new leader is elected (the killed member may have
	// led); it is retried until the context ends.
	put := func(k string) {
		t.Helper()
		for {
			_, err := cli.Put(ctx, k, "v")
			if err == nil {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("put %s: %v", k, err)
			}
			t.Logf("put %s: %v (retrying)", k, err)
			time.Sleep(100 * time.Millisecond)
		}
	}
	put("/before")
	old := cl.Leader()
	pid := cl.PID(old)
	cl.Kill(old)
	if cl.PID(old) != 0 {
		t.Fatalf("PID(%d) = %d after Kill, want 0", old, cl.PID(old))
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("member %d's process %d still exists after Kill", old, pid)
	}
	for i := range 20 {
		put(fmt.Sprintf("/during/%d", i))
	}
	if l := cl.Leader(); l == old {
		t.Fatalf("Leader() = %d, the killed member", l)
	}
	cl.Restart(old)
	if cl.PID(old) == 0 || cl.PID(old) == pid {
		t.Fatalf("PID(%d) after Restart = %d (was %d)", old, cl.PID(old), pid)
	}
	resp, err := cli.Status(ctx, cl.Endpoints()[old])
	if err != nil {
		t.Fatalf("status of the restarted member: %v", err)
	}
	t.Logf("restarted member at raft index %d", resp.RaftIndex)
}

// TestEmbeddedStopStart: the embedded server keeps its data across Stop and Start.
func TestEmbeddedStopStart(t *testing.T) {
	srv := etcdenv.StartEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := srv.Client().Put(ctx, "/k", "v1"); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	srv.Start()
	resp, err := srv.Client().Get(ctx, "/k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v1" {
		t.Fatalf("after Stop and Start: %v %v", resp, err)
	}
}
