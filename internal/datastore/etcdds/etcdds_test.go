package etcdds_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/datastore/datastoretest"
	"github.com/ipledger/ipledger/internal/datastore/etcdds"
	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
)

// open returns a store on endpoints under root, closed when t ends.
func open(t *testing.T, endpoints []string, root string) *etcdds.Store {
	t.Helper()
	s, err := etcdds.New(etcdds.Config{Endpoints: endpoints, Root: root})
	if err != nil {
		t.Fatalf("etcdds.New(%v): %v", endpoints, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestConformanceEmbedded runs the conformance suite against an etcd server
// embedded in the test process (go.etcd.io/etcd/server/v3/embed).
func TestConformanceEmbedded(t *testing.T) {
	t.Parallel() // its own server: the waits of the five overlap
	srv := etcdenv.StartEmbedded(t)
	datastoretest.Run(t, func(t *testing.T) datastore.Store {
		s, err := etcdds.New(etcdds.Config{Endpoints: srv.Endpoints()})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, datastoretest.Options{
		Compact: func(t *testing.T, rev int64) { srv.Compact(t, rev) },
		Stop: func(t *testing.T) func() {
			srv.Stop()
			return srv.Start
		},
	})
}

// TestConformanceDebianEtcd runs the conformance suite against Debian's etcd-server
// (3.4) as a separate process, one member, SIGKILLed and restarted for the
// unavailability test.
func TestConformanceDebianEtcd(t *testing.T) {
	t.Parallel() // its own server: the waits of the five overlap
	cl := etcdenv.StartCluster(t, 1)
	datastoretest.Run(t, func(t *testing.T) datastore.Store {
		s, err := etcdds.New(etcdds.Config{Endpoints: cl.Endpoints(), Root: "/ipledger-conformance/"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, datastoretest.Options{
		Compact: func(t *testing.T, rev int64) { cl.Compact(t, rev) },
		Stop: func(t *testing.T) func() {
			cl.Kill(0)
			return func() { cl.Restart(0) }
		},
	})
}

// TestRootsAreSeparate: two stores with different roots on one server never see
// each other's keys.
func TestRootsAreSeparate(t *testing.T) {
	srv := etcdenv.StartEmbedded(t)
	a := open(t, srv.Endpoints(), "/a/")
	b := open(t, srv.Endpoints(), "/b/")
	ctx := context.Background()
	if _, err := a.Create(ctx, "pools/net1", []byte(`{"by":"a"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, "pools/net1"); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("root /b/ sees root /a/'s key: %v", err)
	}
	if _, err := b.Create(ctx, "pools/net1", []byte(`{"by":"b"}`)); err != nil {
		t.Fatalf("Create of the same key under another root: %v", err)
	}
	kvs, _, err := a.List(ctx, "pools/")
	if err != nil || len(kvs) != 1 || string(kvs[0].Value) != `{"by":"a"}` {
		t.Fatalf("List under /a/: %v %v", kvs, err)
	}
	// The raw etcd keys are root + key.
	resp, err := srv.Client().Get(ctx, "/b/pools/net1")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("etcd key /b/pools/net1: %v %v", resp, err)
	}
}

// TestListPages: a List larger than the page size is one consistent snapshot, in
// key order, even while keys are written meanwhile.
func TestListPages(t *testing.T) {
	srv := etcdenv.StartEmbedded(t)
	s, err := etcdds.New(etcdds.Config{Endpoints: srv.Endpoints(), PageSize: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for i := range 50 {
		if _, err := s.Create(ctx, fmt.Sprintf("blocks/net1/b%03d", i), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // writes during the lists, after the keys already there
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.Create(ctx, fmt.Sprintf("blocks/net1/c%05d", i), []byte(`{}`)); err != nil {
				t.Error(err)
				return
			}
		}
	})
	for range 10 {
		kvs, rev, err := s.List(ctx, "blocks/net1/")
		if err != nil {
			t.Fatal(err)
		}
		// The snapshot holds exactly the keys that existed at rev.
		resp, err := srv.Client().Get(ctx, "/ipledger/blocks/net1/", clientv3.WithPrefix(), clientv3.WithRev(rev))
		if err != nil {
			t.Fatal(err)
		}
		if len(kvs) != len(resp.Kvs) || len(kvs) < 50 {
			t.Fatalf("paged List at revision %d: %d keys, etcd has %d then", rev, len(kvs), len(resp.Kvs))
		}
		for i, kv := range kvs {
			if kv.Key != strings.TrimPrefix(string(resp.Kvs[i].Key), "/ipledger/") || kv.Revision != resp.Kvs[i].ModRevision {
				t.Fatalf("paged List entry %d: %q rev %d, etcd %q rev %d", i, kv.Key, kv.Revision, resp.Kvs[i].Key, resp.Kvs[i].ModRevision)
			}
		}
	}
	close(stop)
	wg.Wait()
}

// TestNewRefusesBadConfig: each bad setting is refused with ErrInvalid naming it.
func TestNewRefusesBadConfig(t *testing.T) {
	cases := []struct {
		name string
		cfg  etcdds.Config
		want string
	}{
		{"no endpoints", etcdds.Config{}, "Endpoints"},
		{"endpoint without scheme", etcdds.Config{Endpoints: []string{"127.0.0.1:2379"}}, "127.0.0.1:2379"},
		{"cert without key", etcdds.Config{Endpoints: []string{"https://127.0.0.1:2379"}, CertFile: "/c.pem"}, "KeyFile"},
		{"root without slashes", etcdds.Config{Endpoints: []string{"http://127.0.0.1:2379"}, Root: "ipledger"}, "Root"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := etcdds.New(c.cfg)
			if err == nil {
				s.Close()
				t.Fatalf("New(%+v) accepted", c.cfg)
			}
			if !errors.Is(err, datastore.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New(%+v): %v; want ErrInvalid naming %s", c.cfg, err, c.want)
			}
		})
	}
	// A CA file that does not exist is an error naming it, not a silent plaintext.
	_, err := etcdds.New(etcdds.Config{Endpoints: []string{"https://127.0.0.1:2379"}, CAFile: "/nonexistent/ca.pem"})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/ca.pem") {
		t.Fatalf("New with a missing CA file: %v", err)
	}
}

// counter is the value of the key the member-kill test increments by CAS: the
// count, and per writer the sequence number of its last applied increment (carried
// along by every writer), so an ambiguous write can be resolved by re-reading.
type counter struct {
	N   int            `json:"n"`
	Seq map[string]int `json:"seq"`
}

// TestClusterMemberKilled: with one member of a three-member etcd cluster (the
// leader) SIGKILLed mid-run and restarted later, the store keeps serving after
// retries, and no compare-and-swap is applied twice or lost: the counter's final
// value is exactly the number of increments each writer saw applied, and a watch
// running throughout, resumed from its last revision if the kill ended it, saw
// every increment once, in order.
func TestClusterMemberKilled(t *testing.T) {
	t.Parallel() // its own server: the waits of the five overlap
	cl := etcdenv.StartCluster(t, 3)
	s := open(t, cl.Endpoints(), "/ipledger/")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const key = "pools/counter"
	init, _ := json.Marshal(counter{Seq: map[string]int{}})
	rev0, err := s.Create(ctx, key, init)
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Watch(ctx, "pools/", rev0)
	if err != nil {
		t.Fatal(err)
	}

	const writers = 4
	per := 60
	if testing.Short() {
		per = 24 // the leader still killed after a third and back after two thirds
	}
	var mu sync.Mutex
	total := 0
	restarted := make(chan struct{})
	unavailable, resolved := 0, 0
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for wi := range writers {
		name := fmt.Sprintf("w%d", wi)
		wg.Go(func() {
			for seq := 1; seq <= per; {
				op, cancelOp := context.WithTimeout(ctx, 5*time.Second)
				kv, err := s.Get(op, key)
				if err == nil {
					var c counter
					if err = json.Unmarshal(kv.Value, &c); err != nil {
						cancelOp()
						errs <- err
						return
					}
					if c.Seq[name] >= seq {
						// Our increment seq was applied (an earlier ambiguous write).
						mu.Lock()
						resolved++
						total++
						mu.Unlock()
						cancelOp()
						seq++
						continue
					}
					c.N++
					c.Seq[name] = seq
					v, _ := json.Marshal(c)
					_, err = s.Update(op, key, v, kv.Revision)
					if err == nil {
						mu.Lock()
						total++
						mu.Unlock()
						seq++
					}
				}
				cancelOp()
				switch {
				case err == nil, errors.Is(err, datastore.ErrConflict):
				case errors.Is(err, datastore.ErrUnavailable):
					// Applied or not: the next Get decides.
					mu.Lock()
					unavailable++
					mu.Unlock()
					time.Sleep(50 * time.Millisecond)
				default:
					errs <- fmt.Errorf("writer %s seq %d: %w", name, seq, err)
					return
				}
			}
		})
	}
	// The chaos: kill the leader after a third of the increments, restart it after
	// two thirds.
	wg.Go(func() {
		waitFor := func(n int) {
			for {
				mu.Lock()
				done := total >= n
				mu.Unlock()
				if done || ctx.Err() != nil {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		waitFor(writers * per / 3)
		leader := cl.Leader()
		t.Logf("killing member %d (the leader, pid %d) at %d increments", leader, cl.PID(leader), writers*per/3)
		cl.Kill(leader)
		waitFor(2 * writers * per / 3)
		t.Logf("restarting member %d", leader)
		cl.Restart(leader)
		close(restarted)
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	select {
	case <-restarted:
	default:
		t.Fatal("the run ended before the member was killed and restarted")
	}

	kv, err := s.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var final counter
	if err := json.Unmarshal(kv.Value, &final); err != nil {
		t.Fatal(err)
	}
	sum := 0
	for wi := range writers {
		name := fmt.Sprintf("w%d", wi)
		if final.Seq[name] != per {
			t.Errorf("writer %s: last applied increment %d, want %d", name, final.Seq[name], per)
		}
		sum += final.Seq[name]
	}
	if final.N != writers*per || final.N != sum {
		t.Fatalf("counter %d after %d increments (per-writer sum %d): a CAS was applied twice or lost", final.N, writers*per, sum)
	}
	t.Logf("%d increments by %d writers across a leader kill: %d ErrUnavailable answers, %d of them found applied on re-read", final.N, writers, unavailable, resolved)

	// The watch saw every increment once, in order, across the kill. A watch
	// may end while its member has no leader (etcdds asks for one, so that a
	// partitioned member's watch does not go quiet): it ends with
	// ErrUnavailable, and a watch from the last revision seen goes on where it
	// stopped, as the agent's consumers resume. Nothing is skipped or repeated.
	last, resumed := rev0, 0
	for n := 1; n <= final.N; n++ {
		var ev datastore.Event
		select {
		case e, ok := <-w.Events():
			if !ok {
				if !errors.Is(w.Err(), datastore.ErrUnavailable) || resumed == 3 {
					t.Fatalf("watch ended after %d of %d increments (resumed %d times): %v", n-1, final.N, resumed, w.Err())
				}
				t.Logf("watch ended after %d of %d increments: %v; watching again from revision %d", n-1, final.N, w.Err(), last)
				resumed++
				if w, err = s.Watch(ctx, "pools/", last); err != nil {
					t.Fatal(err)
				}
				n-- // the same increment, from the new watch
				continue
			}
			ev = e
		case <-time.After(datastoretest.Timeout):
			t.Fatalf("watch delivered %d of %d increments", n-1, final.N)
		}
		var c counter
		if err := json.Unmarshal(ev.KV.Value, &c); err != nil || c.N != n || ev.KV.Revision <= last {
			t.Fatalf("watch event %d: n=%d rev %d (previous %d), err %v", n, c.N, ev.KV.Revision, last, err)
		}
		last = ev.KV.Revision
	}
	if last != kv.Revision {
		t.Fatalf("watch's last revision %d, the key's %d", last, kv.Revision)
	}
}

// TestTLS: with the CA, client certificate and key files a cluster operator gives,
// the store talks to an etcd that requires TLS client authentication; without the
// client certificate, or trusting another CA, it is refused.
func TestTLS(t *testing.T) {
	t.Parallel() // its own server: the waits of the five overlap
	srv, files := etcdenv.StartEmbeddedTLS(t)
	s, err := etcdds.New(etcdds.Config{Endpoints: srv.Endpoints(), CAFile: files.CA, CertFile: files.Cert, KeyFile: files.Key})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rev, err := s.Create(ctx, "pools/net1", []byte(`{"tls":true}`))
	if err != nil {
		t.Fatalf("Create over TLS: %v", err)
	}
	if kv, err := s.Get(ctx, "pools/net1"); err != nil || kv.Revision != rev {
		t.Fatalf("Get over TLS: %+v %v", kv, err)
	}
	// No client certificate: the server refuses the handshake.
	anon, err := etcdds.New(etcdds.Config{Endpoints: srv.Endpoints(), CAFile: files.CA})
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	short, cancel2 := context.WithTimeout(ctx, datastoretest.DownTimeout())
	defer cancel2()
	if _, err := anon.Get(short, "pools/net1"); !errors.Is(err, datastore.ErrUnavailable) {
		t.Fatalf("Get without a client certificate: %v, want ErrUnavailable", err)
	}
	// Plaintext to a TLS port fails too: the scheme decides, never a silent downgrade.
	plain, err := etcdds.New(etcdds.Config{Endpoints: []string{strings.Replace(srv.Endpoints()[0], "https://", "http://", 1)}})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	short3, cancel3 := context.WithTimeout(ctx, datastoretest.DownTimeout())
	defer cancel3()
	if _, err := plain.Get(short3, "pools/net1"); err == nil {
		t.Fatal("plaintext Get from a TLS port succeeded")
	}
}

// TestQuorumLost: with two of three members killed, the survivor has no leader.
// Reads, writes and lease renewals then fail with ErrUnavailable (a holder is never
// told its lease was renewed), a running watch ends with ErrUnavailable instead of
// going silent, and once the members are back the same store serves again.
func TestQuorumLost(t *testing.T) {
	t.Parallel() // its own server: the waits of the five overlap
	cl := etcdenv.StartCluster(t, 3)
	s := open(t, cl.Endpoints(), "/ipledger/")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rev, err := s.Create(ctx, "blocks/net1/10-0-0-0-26", []byte(`{"owner":"a"}`))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Leases().Acquire(ctx, "node-a", "agent-a", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Watch(ctx, "blocks/", rev)
	if err != nil {
		t.Fatal(err)
	}
	cl.Kill(1)
	cl.Kill(2)
	short := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(ctx, datastoretest.DownTimeout())
	}
	c1, k1 := short()
	_, err = s.Get(c1, "blocks/net1/10-0-0-0-26")
	k1()
	if !errors.Is(err, datastore.ErrUnavailable) {
		t.Fatalf("Get without quorum: %v, want ErrUnavailable", err)
	}
	c2, k2 := short()
	_, err = s.Update(c2, "blocks/net1/10-0-0-0-26", []byte(`{"owner":"b"}`), rev)
	k2()
	if !errors.Is(err, datastore.ErrUnavailable) {
		t.Fatalf("Update without quorum: %v, want ErrUnavailable", err)
	}
	c3, k3 := short()
	_, err = s.Leases().Renew(c3, l)
	k3()
	if !errors.Is(err, datastore.ErrUnavailable) {
		t.Fatalf("Renew without quorum: %v, want ErrUnavailable", err)
	}
	select {
	case ev, ok := <-w.Events():
		if ok {
			t.Fatalf("watch without quorum delivered %+v", ev)
		}
		if !errors.Is(w.Err(), datastore.ErrUnavailable) {
			t.Fatalf("watch without quorum ended with %v, want ErrUnavailable", w.Err())
		}
		t.Logf("watch ended: %v", w.Err())
	case <-time.After(datastoretest.Timeout):
		t.Fatalf("watch still open %v after the quorum was lost", datastoretest.Timeout)
	}
	cl.Restart(1)
	cl.Restart(2)
	// Back: the same store serves again without being reopened. The update sent
	// without quorum may or may not have been applied (ErrUnavailable says so); the
	// re-read tells.
	for {
		kv, err := s.Get(ctx, "blocks/net1/10-0-0-0-26")
		if err == nil {
			if kv.Revision != rev {
				t.Logf("the update sent without quorum was applied later (rev %d)", kv.Revision)
			}
			break
		}
		if !errors.Is(err, datastore.ErrUnavailable) {
			t.Fatalf("Get after recovery: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := s.Leases().Renew(ctx, l); err != nil {
		t.Fatalf("Renew after recovery: %v", err)
	}
}
