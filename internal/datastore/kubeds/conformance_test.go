package kubeds_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/datastore/datastoretest"
	"github.com/ipledger/ipledger/internal/datastore/kubeds"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// TestConformance runs the datastore conformance suite against a real
// kube-apiserver (with its etcd) and the CRDs of deploy/ipledger.yaml. All
// stores share the server and the Lease namespace, as agents do.
func TestConformance(t *testing.T) {
	e := startEnv(t, kubeenv.APIServerOptions{})
	const ns = "ipledger"
	e.namespace(t, ns)
	datastoretest.Run(t, func(t *testing.T) datastore.Store {
		s, err := kubeds.New(e.cfg, kubeds.Options{Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, datastoretest.Options{
		// Compaction as a client meets it: etcd compacted (what the apiserver
		// itself does every 5 minutes), and the apiserver's watch cache, which
		// serves watches, restarted above that revision (what a restarted
		// apiserver has; a running one drops old events as its cache fills).
		Compact: func(t *testing.T, rev int64) {
			compactEtcd(t, e.api.EtcdURL, rev)
			if err := e.api.Restart(); err != nil {
				t.Fatal(err)
			}
		},
		Stop: func(t *testing.T) func() {
			e.api.Stop()
			return func() {
				if err := e.api.Start(); err != nil {
					t.Fatal(err)
				}
			}
		},
		LeaseTTL: time.Second,
		NoExpiry: "Kubernetes never expires a Lease; observers judge expiry by the revision not moving for the TTL",
	})
}

// compactEtcd compacts etcd's history up to rev through its JSON gateway.
func compactEtcd(t *testing.T, etcdURL string, rev int64) {
	t.Helper()
	body := fmt.Sprintf(`{"revision":"%d","physical":true}`, rev)
	resp, err := http.Post(etcdURL+"/v3/kv/compaction", "application/json", bytes.NewBufferString(body))
	if err != nil {
		t.Fatalf("etcd compaction: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("etcd compaction at %d: %s: %s", rev, resp.Status, b)
	}
	t.Logf("etcd compacted at revision %d", rev)
}
