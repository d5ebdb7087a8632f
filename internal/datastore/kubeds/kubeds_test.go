package kubeds_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/datastore/kubeds"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// jsonEq reports whether a and b are the same JSON value (the store gives the
// value back re-encoded by the apiserver).
func jsonEq(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(x, y)
}

func mustCreate(t *testing.T, s datastore.Store, key, value string) int64 {
	t.Helper()
	rev, err := s.Create(ctxT(t), key, []byte(value))
	if err != nil {
		t.Fatalf("create %s: %v", key, err)
	}
	return rev
}

// TestKubernetesAPI runs the store against one real kube-apiserver with the CRDs
// installed from deploy/ipledger.yaml; every subtest starts from an empty store.
func TestKubernetesAPI(t *testing.T) {
	e := startEnv(t, kubeenv.APIServerOptions{})

	// what operators apply (ippool_test.go, reservation_test.go)
	t.Run("OperatorIPPool", func(t *testing.T) { operatorIPPool(t, e) })
	t.Run("IPPoolDrainedSchema", func(t *testing.T) { ipPoolDrainedSchema(t, e) })
	t.Run("OperatorIPReservation", func(t *testing.T) { operatorIPReservation(t, e) })

	t.Run("CreateGetUpdateDelete", func(t *testing.T) {
		s := e.store(t)
		ctx := ctxT(t)
		key := "blocks/pod-net/10-0-0-64-26"
		// Fields the CRD declares, and others it keeps; an integer above 2^53.
		val := `{"network":"pod-net","cidr":"10.0.0.64/26","owner":"node-a","epoch":9007199254740993,"extra":{"kept":true,"list":[1,"a",null,1.5]}}`
		rev := mustCreate(t, s, key, val)
		kv, err := s.Get(ctx, key)
		if err != nil || kv.Key != key || kv.Revision != rev || !jsonEq(t, kv.Value, []byte(val)) || !strings.Contains(string(kv.Value), "9007199254740993") {
			t.Fatalf("get after create: %+v (%s), %v; want rev %d value %s", kv, kv.Value, err, rev, val)
		}
		if _, err := s.Create(ctx, key, []byte(`{"owner":"node-b"}`)); !errors.Is(err, datastore.ErrExists) {
			t.Fatalf("second create: %v, want ErrExists", err)
		}
		val2 := `{"network":"pod-net","cidr":"10.0.0.64/26","owner":"node-b","epoch":2}`
		rev2, err := s.Update(ctx, key, []byte(val2), rev)
		if err != nil || rev2 <= rev {
			t.Fatalf("update: rev %d, %v (was %d)", rev2, err, rev)
		}
		if _, err := s.Update(ctx, key, []byte(`{"owner":"node-c"}`), rev); !errors.Is(err, datastore.ErrConflict) {
			t.Fatalf("update with the old revision: %v, want ErrConflict", err)
		}
		// The same value again is still a write with a new revision (a PUT that
		// changes nothing would keep the resourceVersion).
		rev3, err := s.Update(ctx, key, []byte(val2), rev2)
		if err != nil || rev3 <= rev2 {
			t.Fatalf("update with the same value: rev %d, %v (was %d)", rev3, err, rev2)
		}
		if _, err := s.Update(ctx, key, []byte(val2), rev2); !errors.Is(err, datastore.ErrConflict) {
			t.Fatalf("second update of one revision with the same value: %v, want ErrConflict", err)
		}
		if err := s.Delete(ctx, key, rev2); !errors.Is(err, datastore.ErrConflict) {
			t.Fatalf("delete with an old revision: %v, want ErrConflict", err)
		}
		if err := s.Delete(ctx, key, rev3); err != nil {
			t.Fatalf("delete: %v", err)
		}
		if _, err := s.Get(ctx, key); !errors.Is(err, datastore.ErrNotFound) {
			t.Fatalf("get after delete: %v, want ErrNotFound", err)
		}
		if _, err := s.Update(ctx, key, []byte(val2), rev3); !errors.Is(err, datastore.ErrNotFound) {
			t.Fatalf("update after delete: %v, want ErrNotFound", err)
		}
		if err := s.Delete(ctx, key, rev3); !errors.Is(err, datastore.ErrNotFound) {
			t.Fatalf("delete after delete: %v, want ErrNotFound", err)
		}
		rev4 := mustCreate(t, s, key, val)
		if rev4 <= rev3 {
			t.Fatalf("re-created key has revision %d, not above %d", rev4, rev3)
		}
	})

	t.Run("AgentRecordsFitTheCRDs", func(t *testing.T) {
		s := e.store(t)
		ctx := ctxT(t)
		// The records internal/cluster writes (PoolRecord, BlockRecord), as JSON.
		for key, v := range map[string]string{
			"pools/k8s-pod-network":               `{"network":"k8s-pod-network","ranges":[[{"subnet":"10.0.0.0/16","gateway":"10.0.0.1"}],[{"subnet":"fd00::/112","rangeStart":"fd00::10","rangeEnd":"fd00::ff00"}]],"blockBits":[26,122]}`,
			"blocks/k8s-pod-network/10-0-0-64-26": `{"network":"k8s-pod-network","cidr":"10.0.0.64/26","set":0,"owner":"node-a","holder":"node-a/4711","epoch":3,"lease":"0b5e6c1a-uid"}`,
			"blocks/k8s-pod-network/fd00--40-122": `{"network":"k8s-pod-network","cidr":"fd00::40/122","set":1,"owner":"","epoch":4}`,
			"blocks/net.2e1/10-1-0-0-26":          `{"network":"net.1","cidr":"10.1.0.0/26","set":0,"owner":"node-b","epoch":1}`,
		} {
			rev := mustCreate(t, s, key, v)
			kv, err := s.Get(ctx, key)
			if err != nil || kv.Revision != rev || !jsonEq(t, kv.Value, []byte(v)) {
				t.Errorf("%s: got %s rev %d (%v), want %s rev %d", key, kv.Value, kv.Revision, err, v, rev)
			}
		}
		out, err := e.api.Kubectl("get", "ipblocks", "-o", "custom-columns=NAME:.metadata.name,OWNER:.spec.owner,EPOCH:.spec.epoch", "--no-headers", "--sort-by=.metadata.name")
		if err != nil {
			t.Fatal(err)
		}
		if want := "k8s-pod-network.10-0-0-64-26   node-a   3\nk8s-pod-network.fd00--40-122   4\n"; !strings.HasPrefix(strings.Join(strings.Fields(out), " "), strings.Join(strings.Fields(want), " ")) {
			t.Errorf("kubectl get ipblocks:\n%s\nwant it to start with\n%s", out, want)
		}
	})

	t.Run("ListByPrefixAndNetwork", func(t *testing.T) {
		s := e.store(t)
		ctx := ctxT(t)
		long := strings.Repeat("n", 100) // not a label value: hashed label
		keys := []string{
			"blocks/a/10-0-0-0-26", "blocks/a/10-0-0-64-26", "blocks/ab/10-1-0-0-26",
			"blocks/b/10-2-0-0-26", "blocks/" + long + "/fd00--40-122", "blocks/x.y/10-3-0-0-26",
			"pools/a", "pools/ab", "pools/" + long,
		}
		var maxRev int64
		for _, k := range keys {
			if r := mustCreate(t, s, k, `{"n":1}`); r > maxRev {
				maxRev = r
			}
		}
		for _, c := range []struct {
			prefix string
			want   []string
		}{
			{"blocks/a/", []string{"blocks/a/10-0-0-0-26", "blocks/a/10-0-0-64-26"}},
			{"blocks/" + long + "/", []string{"blocks/" + long + "/fd00--40-122"}},
			{"blocks/x.y/", []string{"blocks/x.y/10-3-0-0-26"}},
			{"blocks/", []string{"blocks/a/10-0-0-0-26", "blocks/a/10-0-0-64-26", "blocks/ab/10-1-0-0-26", "blocks/b/10-2-0-0-26", "blocks/" + long + "/fd00--40-122", "blocks/x.y/10-3-0-0-26"}},
			{"pools/", []string{"pools/a", "pools/ab", "pools/" + long}},
			{"blocks/c/", nil},
		} {
			kvs, rev, err := s.List(ctx, c.prefix)
			if err != nil {
				t.Fatalf("list %s: %v", c.prefix, err)
			}
			var got []string
			for _, kv := range kvs {
				got = append(got, kv.Key)
				if kv.Revision > rev {
					t.Errorf("list %s: %s at revision %d above the list's %d", c.prefix, kv.Key, kv.Revision, rev)
				}
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("list %s: %q, want %q", c.prefix, got, c.want)
			}
			if rev < maxRev {
				t.Errorf("list %s: revision %d below the last write's %d", c.prefix, rev, maxRev)
			}
		}
	})

	t.Run("KeysThatAreNoObjectName", func(t *testing.T) {
		s := e.store(t)
		ctx := ctxT(t)
		// Distinct keys whose plain "<network>.<block>" names would be equal, a
		// name too long for an object, names no DNS subdomain allows.
		keys := []string{"blocks/a.b/c", "blocks/a/b.c", "blocks/" + strings.Repeat("x", 120) + "/" + strings.Repeat("y", 120),
			"blocks/-a/b", "pools/-a", "pools/a..b", "blocks/a/b."}
		for i, k := range keys {
			mustCreate(t, s, k, fmt.Sprintf(`{"i":%d}`, i))
		}
		for i, k := range keys {
			kv, err := s.Get(ctx, k)
			if err != nil || !jsonEq(t, kv.Value, []byte(fmt.Sprintf(`{"i":%d}`, i))) {
				t.Errorf("get %s: %s, %v", k, kv.Value, err)
			}
		}
	})

	t.Run("OtherKindsAndShapes", func(t *testing.T) {
		s := e.store(t)
		ctx := ctxT(t)
		// Kinds other than pools and blocks share the IPRecord resource; pools and
		// blocks keys of other shapes get hashed names in their own resource.
		keys := []string{"config/cluster", "config/net1/a/b", "config2/net1", "blocks/net1", "blocks/net1/a/b", "pools/net1/x"}
		for i, k := range keys {
			mustCreate(t, s, k, fmt.Sprintf(`{"i":%d}`, i))
		}
		for _, c := range []struct {
			prefix string
			want   []string
		}{
			{"config/", []string{"config/cluster", "config/net1/a/b"}},
			{"config/net1/", []string{"config/net1/a/b"}},
			{"config/net1/a/", []string{"config/net1/a/b"}},
			{"config2/", []string{"config2/net1"}},
			{"blocks/", []string{"blocks/net1", "blocks/net1/a/b"}},
			{"blocks/net1/", []string{"blocks/net1/a/b"}},
			{"pools/", []string{"pools/net1/x"}},
		} {
			kvs, _, err := s.List(ctx, c.prefix)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, kv := range kvs {
				got = append(got, kv.Key)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("list %s: %q, want %q", c.prefix, got, c.want)
			}
		}
		_, from, err := s.List(ctx, "config/")
		if err != nil {
			t.Fatal(err)
		}
		w, err := s.Watch(ctx, "config/net1/", from)
		if err != nil {
			t.Fatal(err)
		}
		mustCreate(t, s, "config/net2/a", `{}`)
		r := mustCreate(t, s, "config/net1/c", `{}`)
		select {
		case ev := <-w.Events():
			if ev.KV.Key != "config/net1/c" || ev.KV.Revision != r {
				t.Fatalf("watch config/net1/: %v %s rev %d, want config/net1/c at %d", ev.Type, ev.KV.Key, ev.KV.Revision, r)
			}
		case <-time.After(time.Minute):
			t.Fatal("watch config/net1/: no event")
		}
	})

	t.Run("CRDMissingThenInstalledAgain", func(t *testing.T) {
		s := e.store(t)
		ctx := ctxT(t)
		if out, err := e.api.Kubectl("delete", "crd", "iprecords.ipledger.io", "--wait=true"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		// Until the CRD is back: a clear error, not "not found" (which would
		// make an agent think a record is absent).
		if err := kubeenv.WaitFor(time.Minute, 100*time.Millisecond, func() (bool, error) {
			_, err := s.Get(ctx, "config/x")
			return errors.Is(err, datastore.ErrUnavailable) && strings.Contains(err.Error(), "deploy/ipledger.yaml"), err
		}); err != nil {
			t.Fatalf("get with the CRD deleted: %v", err)
		}
		_, err := s.Create(ctx, "config/x", []byte(`{}`))
		if !errors.Is(err, datastore.ErrUnavailable) || errors.Is(err, datastore.ErrNotFound) {
			t.Fatalf("create with the CRD deleted: %v, want ErrUnavailable", err)
		}
		// InstallCRDs again (what a fresh install and an upgrade do): idempotent.
		for i := 0; i < 2; i++ {
			if _, err := kubeds.InstallCRDs(ctx, e.cfg, manifest(t)); err != nil {
				t.Fatal(err)
			}
		}
		if err := kubeenv.WaitFor(time.Minute, 100*time.Millisecond, func() (bool, error) {
			_, err := s.Create(ctx, "config/x", []byte(`{}`))
			return err == nil, err
		}); err != nil {
			t.Fatalf("create after reinstalling the CRD: %v", err)
		}
	})

	t.Run("InvalidInput", func(t *testing.T) {
		s := e.store(t)
		ctx := ctxT(t)
		for _, c := range []struct {
			key, value string
		}{
			{"nodes/a", `{}`},
			{"pools/A", `{}`},
			{"pools/a_b", `{}`},
			{"pools/", `{}`},
			{"pools/a", `[1]`},
			{"pools/a", `"x"`},
			{"pools/a", `{`},
			{"pools/a", `{"x":"` + strings.Repeat("a", datastore.MaxValue) + `"}`},
			{"blocks/a/b", `{"epoch":"one"}`}, // the CRD declares epoch an integer
		} {
			if _, err := s.Create(ctx, c.key, []byte(c.value)); !errors.Is(err, datastore.ErrInvalid) {
				t.Errorf("create %s %.40s: %v, want ErrInvalid", c.key, c.value, err)
			}
		}
		if _, _, err := s.List(ctx, "nodes/"); !errors.Is(err, datastore.ErrInvalid) {
			t.Errorf("list nodes/: %v, want ErrInvalid", err)
		}
		if _, err := s.Watch(ctx, "blocks/", 0); !errors.Is(err, datastore.ErrInvalid) {
			t.Errorf("watch from 0: %v, want ErrInvalid", err)
		}
		if _, err := s.Leases().Acquire(ctx, "node-a", "h", 1500*time.Millisecond); !errors.Is(err, datastore.ErrInvalid) {
			t.Errorf("acquire with ttl 1.5s: %v, want ErrInvalid", err)
		}
	})

	t.Run("Watch", func(t *testing.T) {
		s := e.store(t)
		ctx := ctxT(t)
		mustCreate(t, s, "blocks/a/1", `{"v":0}`)
		_, from, err := s.List(ctx, "blocks/a/")
		if err != nil {
			t.Fatal(err)
		}
		wctx, stop := context.WithCancel(ctx)
		w, err := s.Watch(wctx, "blocks/a/", from)
		if err != nil {
			t.Fatal(err)
		}
		// Changes: some under the prefix, some outside it (another network, pools).
		r2 := mustCreate(t, s, "blocks/a/2", `{"v":1}`)
		mustCreate(t, s, "blocks/b/1", `{"v":2}`)
		mustCreate(t, s, "pools/a", `{"v":3}`)
		r2b, err := s.Update(ctx, "blocks/a/2", []byte(`{"v":4}`), r2)
		if err != nil {
			t.Fatal(err)
		}
		kv1, _ := s.Get(ctx, "blocks/a/1")
		if err := s.Delete(ctx, "blocks/a/1", kv1.Revision); err != nil {
			t.Fatal(err)
		}
		want := []struct {
			typ datastore.EventType
			key string
			val string
		}{{datastore.Put, "blocks/a/2", `{"v":1}`}, {datastore.Put, "blocks/a/2", `{"v":4}`}, {datastore.Deleted, "blocks/a/1", ""}}
		last := from
		for i, w0 := range want {
			select {
			case ev, ok := <-w.Events():
				if !ok {
					t.Fatalf("watch closed after %d events: %v", i, w.Err())
				}
				if ev.Type != w0.typ || ev.KV.Key != w0.key || (w0.val != "" && !jsonEq(t, ev.KV.Value, []byte(w0.val))) || ev.KV.Revision <= last {
					t.Fatalf("event %d: %v %s %s rev %d; want %v %s %s after rev %d", i, ev.Type, ev.KV.Key, ev.KV.Value, ev.KV.Revision, w0.typ, w0.key, w0.val, last)
				}
				if i == 1 && ev.KV.Revision != r2b {
					t.Fatalf("update event at revision %d, Update returned %d", ev.KV.Revision, r2b)
				}
				last = ev.KV.Revision
			case <-time.After(time.Minute):
				t.Fatalf("no event %d after a minute", i)
			}
		}
		stop()
		for range w.Events() {
			t.Fatal("an event after the last change")
		}
		if err := w.Err(); err != nil {
			t.Fatalf("watch ended by its context: Err %v, want nil", err)
		}
	})

	t.Run("WatchFromACompactedRevision", func(t *testing.T) {
		s := e.store(t)
		ctx := ctxT(t)
		mustCreate(t, s, "blocks/a/1", `{}`)
		// Revision 1 is older than anything the apiserver's watch cache keeps.
		w, err := s.Watch(ctx, "blocks/", 1)
		if err == nil {
			for range w.Events() {
			}
			err = w.Err()
		}
		if !errors.Is(err, datastore.ErrCompacted) {
			t.Fatalf("watch from revision 1: %v, want ErrCompacted", err)
		}
	})

	t.Run("Leases", func(t *testing.T) {
		s := e.store(t)
		ctx := ctxT(t)
		ls := s.Leases()
		a, err := ls.Acquire(ctx, "node-a", "node-a/boot-1", 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if a.Node != "node-a" || a.Holder != "node-a/boot-1" || a.TTL != 10*time.Second || a.Revision <= 0 || a.ID == "" {
			t.Fatalf("acquired %+v", a)
		}
		a2, err := ls.Renew(ctx, a)
		if err != nil || a2.Revision <= a.Revision || a2.ID != a.ID {
			t.Fatalf("renew: %+v, %v (was %+v)", a2, err, a)
		}
		if _, err := ls.Renew(ctx, a); !errors.Is(err, datastore.ErrConflict) {
			t.Fatalf("renew of a stale revision: %v, want ErrConflict", err)
		}
		// Another agent on the node takes the lease over: the old holder's renew fails.
		b, err := ls.Acquire(ctx, "node-a", "node-a/boot-2", 10*time.Second)
		if err != nil || b.Holder != "node-a/boot-2" || b.Revision <= a2.Revision {
			t.Fatalf("takeover: %+v, %v", b, err)
		}
		if _, err := ls.Renew(ctx, a2); !errors.Is(err, datastore.ErrConflict) {
			t.Fatalf("renew after a takeover: %v, want ErrConflict", err)
		}
		c, err := ls.Acquire(ctx, "node-c", "node-c/boot-1", 4*time.Second)
		if err != nil || c.TTL != 4*time.Second {
			t.Fatalf("acquire node-c: %+v, %v", c, err)
		}
		all, err := ls.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != 2 || !reflect.DeepEqual(all[0], b) || !reflect.DeepEqual(all[1], c) {
			t.Fatalf("list: %+v, want %+v and %+v", all, b, c)
		}
		if err := ls.Release(ctx, a2); !errors.Is(err, datastore.ErrConflict) {
			t.Fatalf("release of a stale lease: %v, want ErrConflict", err)
		}
		if err := ls.Release(ctx, b); err != nil {
			t.Fatal(err)
		}
		if _, err := ls.Renew(ctx, b); !errors.Is(err, datastore.ErrNotFound) {
			t.Fatalf("renew after release: %v, want ErrNotFound", err)
		}
		if all, err := ls.List(ctx); err != nil || len(all) != 1 || all[0].Node != "node-c" {
			t.Fatalf("list after release: %+v, %v", all, err)
		}
	})

	t.Run("ConcurrentCASExactlyOneWinner", func(t *testing.T) {
		s := e.store(t)
		ctx := ctxT(t)
		const racers, rounds = 8, 10
		// Separate Stores: separate clients, as separate agents are.
		stores := make([]datastore.Store, racers)
		for i := range stores {
			st, err := kubeds.New(e.cfg, kubeds.Options{})
			if err != nil {
				t.Fatal(err)
			}
			stores[i] = st
		}
		race := func(op func(i int) error) (won []int, otherErrs []error) {
			var mu sync.Mutex
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := 0; i < racers; i++ {
				wg.Go(func() {
					<-start
					err := op(i)
					mu.Lock()
					defer mu.Unlock()
					if err == nil {
						won = append(won, i)
					} else {
						otherErrs = append(otherErrs, err)
					}
				})
			}
			close(start)
			wg.Wait()
			return won, otherErrs
		}
		key := "blocks/net/10-0-0-0-26"
		won, errs := race(func(i int) error {
			_, err := stores[i].Create(ctx, key, []byte(fmt.Sprintf(`{"owner":"node-%d","epoch":1}`, i)))
			return err
		})
		if len(won) != 1 {
			t.Fatalf("create race: %d winners %v", len(won), won)
		}
		for _, err := range errs {
			if !errors.Is(err, datastore.ErrExists) {
				t.Fatalf("create race loser: %v, want ErrExists", err)
			}
		}
		for r := 0; r < rounds; r++ {
			kv, err := s.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			won, errs := race(func(i int) error {
				_, err := stores[i].Update(ctx, key, []byte(fmt.Sprintf(`{"owner":"node-%d","epoch":%d}`, i, r+2)), kv.Revision)
				return err
			})
			if len(won) != 1 {
				t.Fatalf("round %d: %d winners %v", r, len(won), won)
			}
			for _, err := range errs {
				if !errors.Is(err, datastore.ErrConflict) {
					t.Fatalf("round %d loser: %v, want ErrConflict", r, err)
				}
			}
			now, err := s.Get(ctx, key)
			if err != nil || !jsonEq(t, now.Value, []byte(fmt.Sprintf(`{"owner":"node-%d","epoch":%d}`, won[0], r+2))) {
				t.Fatalf("round %d: stored %s (%v), winner node-%d", r, now.Value, err, won[0])
			}
		}
		kv, err := s.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		won, errs = race(func(i int) error { return stores[i].Delete(ctx, key, kv.Revision) })
		if len(won) != 1 {
			t.Fatalf("delete race: %d winners %v", len(won), won)
		}
		for _, err := range errs {
			if !errors.Is(err, datastore.ErrNotFound) && !errors.Is(err, datastore.ErrConflict) {
				t.Fatalf("delete race loser: %v, want ErrNotFound or ErrConflict", err)
			}
		}
		// Leases: racing takeovers each succeed in turn, racing renews of one
		// revision have one winner.
		l, err := s.Leases().Acquire(ctx, "node-x", "x", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		rs := make([]datastore.Leases, racers)
		for i := range rs {
			st, err := kubeds.New(e.cfg, kubeds.Options{Namespace: s.Namespace()})
			if err != nil {
				t.Fatal(err)
			}
			rs[i] = st.Leases()
		}
		won, errs = race(func(i int) error { _, err := rs[i].Renew(ctx, l); return err })
		if len(won) != 1 {
			t.Fatalf("renew race: %d winners %v (%v)", len(won), won, errs)
		}
		for _, err := range errs {
			if !errors.Is(err, datastore.ErrConflict) {
				t.Fatalf("renew race loser: %v, want ErrConflict", err)
			}
		}
	})

	t.Run("ManifestInstallsAndGrantsTheAgent", func(t *testing.T) {
		e.store(t) // empties the records; the agent's store is opened below
		ctx := ctxT(t)
		// The whole manifest and cluster mode's RBAC (deploy/cluster/rbac.yaml,
		// what kubectl apply -k deploy/cluster adds) are accepted by the apiserver
		// (no node runs the DaemonSet's pod here), and re-applying them changes
		// nothing.
		clusterRBAC, err := os.ReadFile(filepath.Join(filepath.Dir(manifestPath), "cluster", "rbac.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			// in this order: the manifest creates the namespace rbac.yaml's objects live in
			for _, f := range []struct {
				name string
				m    []byte
			}{{"deploy/ipledger.yaml", manifest(t)}, {"deploy/cluster/rbac.yaml", clusterRBAC}} {
				if out, err := e.api.KubectlIn(f.m, "apply", "-f", "-"); err != nil {
					t.Fatalf("kubectl apply %s: %v\n%s", f.name, err, out)
				}
			}
		}
		out, err := e.api.Kubectl("get", "daemonset/ipledgerd", "-n", "ipledger", "-o", "jsonpath={.spec.template.spec.serviceAccountName}")
		if err != nil || out != "ipledgerd" {
			t.Fatalf("DaemonSet serviceAccountName %q, %v", out, err)
		}
		// The agent's ServiceAccount can do all the store does, and no more
		// than the manifest grants.
		cfg := e.api.Config()
		cfg.Impersonate.UserName = "system:serviceaccount:ipledger:ipledgerd"
		// as the token of its pod on node n1 authenticates (the manifest's
		// admission policy lets it patch that Node's status only)
		cfg.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/node-name": {"n1"}}
		s, err := kubeds.New(cfg, kubeds.Options{})
		if err != nil {
			t.Fatal(err)
		}
		rev, err := s.Create(ctx, "pools/net", []byte(`{"network":"net","blockSize":26}`))
		if err != nil {
			t.Fatalf("agent creates a pool: %v", err)
		}
		if _, err := s.Update(ctx, "pools/net", []byte(`{"network":"net","blockSize":27}`), rev); err != nil {
			t.Fatalf("agent updates a pool: %v", err)
		}
		brev, err := s.Create(ctx, "blocks/net/10-0-0-0-26", []byte(`{"network":"net","cidr":"10.0.0.0/26","owner":"n1","epoch":1}`))
		if err != nil {
			t.Fatalf("agent claims a block: %v", err)
		}
		_, lrev, err := s.List(ctx, "blocks/net/")
		if err != nil {
			t.Fatalf("agent lists blocks: %v", err)
		}
		w, err := s.Watch(ctx, "blocks/", lrev)
		if err != nil {
			t.Fatalf("agent watches blocks: %v", err)
		}
		if err := s.Delete(ctx, "blocks/net/10-0-0-0-26", brev); err != nil {
			t.Fatalf("agent gives a block back: %v", err)
		}
		select {
		case ev := <-w.Events():
			if ev.Type != datastore.Deleted {
				t.Fatalf("agent's watch: %+v", ev)
			}
		case <-time.After(time.Minute):
			t.Fatal("agent's watch saw nothing")
		}
		l, err := s.Leases().Acquire(ctx, "n1", "n1/1", 10*time.Second)
		if err != nil {
			t.Fatalf("agent acquires its lease in namespace ipledger: %v", err)
		}
		if _, err := s.Leases().Renew(ctx, l); err != nil {
			t.Fatalf("agent renews its lease: %v", err)
		}
		if _, err := s.Leases().List(ctx); err != nil {
			t.Fatalf("agent lists leases: %v", err)
		}
		// The Node watch: the agent may list and watch Nodes and patch its
		// Node's status.
		e.createNode(t, "n1")
		agentWatchesNodes(t, e, cfg, "n1")
		// Outside the grant: leases of another namespace, secrets.
		other, err := kubeds.New(cfg, kubeds.Options{Namespace: "default"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Leases().Acquire(ctx, "n1", "n1/1", 10*time.Second); err == nil || !strings.Contains(err.Error(), "forbidden") {
			t.Fatalf("agent acquires a lease in namespace default: %v, want forbidden", err)
		}
		out, err = e.api.Kubectl("auth", "can-i", "list", "secrets", "--as", cfg.Impersonate.UserName, "-A")
		if strings.TrimSpace(out) != "no" {
			t.Fatalf("kubectl auth can-i list secrets as the agent: %q, %v; want no", out, err)
		}
	})
}
