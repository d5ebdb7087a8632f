package agent_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/spool"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// scrape reads /metrics with the Prometheus text parser.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := get(t, "http://"+addr+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics is not Prometheus text: %v", err)
	}
	return fams
}

// value returns the value of the series of family name whose labels include want
// (label=value pairs); it fails the test when there is none.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	t.Helper()
	if fams[name] == nil {
		t.Fatalf("no metric %s", name)
	}
	v, ok := peek(fams, name, want...)
	if !ok {
		t.Fatalf("no series %s%v", name, want)
	}
	return v
}

// peek is value without failing: ok is false when the series is not there (yet).
func peek(fams map[string]*dto.MetricFamily, name string, want ...string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for _, kv := range want {
			k, v, _ := strings.Cut(kv, "=")
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

// TestMetricsAfterChurn scrapes a running agent over HTTP after a known churn: the
// per-reason release counters equal what the churn did, the books balance (gauge 0)
// on every network, and the request, pool and spool figures match.
func TestMetricsAfterChurn(t *testing.T) {
	addr := netenv.FreeAddr(t)
	a := agentenv.Start(t, agentenv.Options{Args: []string{"--metrics-addr", addr, "--reuse-delay", "1h"}})
	sets := ledgertest.Ranges(t, `[[{"subnet":"10.94.0.0/24"}],[{"subnet":"fd94::/120"}]]`)
	other, _ := pool.ParseRangeSets([]byte(`[[{"subnet":"10.95.0.0/28"}]]`))
	call := func(r api.Request) *api.Response {
		t.Helper()
		resp, err := a.Call(r)
		if err != nil {
			t.Fatalf("%s %s: %v", r.Op, r.ContainerID, err)
		}
		return resp
	}
	add := func(network, cid string) {
		r := sets
		if network == "other" {
			r = other
		}
		call(api.Request{Op: api.OpAdd, Network: network, ContainerID: cid, IfName: "eth0", Ranges: r, Pod: api.Pod{Namespace: "ns", Name: cid, UID: "uid-" + cid}})
	}
	// before a restart: 3 leases, one DEL lost while the agent is down (spooled)
	for i := range 3 {
		add("pods", fmt.Sprint("pre", i))
	}
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := spool.Write(a.SpoolDir, spool.Entry{Version: 1, Key: api.Key{Network: "pods", ContainerID: "pre0", IfName: "eth0"}, Spooled: time.Now(), CNIVerb: "DEL"}); err != nil {
		t.Fatal(err)
	}
	a.Restart() // counters start at 0; the spooled DEL is applied before serving
	// the churn this agent serves
	const adds, dels, gcs, manuals = 20, 7, 3, 2
	for i := range adds {
		add("pods", fmt.Sprint("c", i))
	}
	add("pods", "c0") // idempotent: no new lease
	for i := range dels {
		call(api.Request{Op: api.OpDel, Network: "pods", ContainerID: fmt.Sprint("c", i), IfName: "eth0"})
	}
	call(api.Request{Op: api.OpDel, Network: "pods", ContainerID: "never-added", IfName: "eth0"}) // releases nothing
	for i := range 4 {
		add("other", fmt.Sprint("o", i))
	}
	// GC of "other" keeps o0; releases o1..o3
	call(api.Request{Op: api.OpGC, Network: "other", Valid: []api.Attachment{{ContainerID: "o0", IfName: "eth0"}}})
	for i := range manuals {
		call(api.Request{Op: api.OpRelease, Network: "pods", ContainerID: fmt.Sprint("c", dels+i), IfName: "eth0", Detail: "test"})
	}
	if _, err := a.Call(api.Request{Op: api.OpRelease, Network: "pods", ContainerID: "never-added", IfName: "eth0"}); err == nil {
		t.Fatal("release of an unknown attachment succeeded")
	}
	if _, err := a.Call(api.Request{Op: "frobnicate"}); err == nil {
		t.Fatal("unknown op answered")
	}

	// one scrape: the agent counts a request before it answers it
	fams := scrape(t, addr)
	for reason, want := range map[ledger.Reason]int{
		ledger.ReasonDEL: dels + 1, ledger.ReasonGC: gcs, ledger.ReasonManual: manuals,
		ledger.ReasonSuperseded: 0, ledger.ReasonReconcileGone: 0, ledger.ReasonReconcileNotReady: 0,
	} {
		if got := value(t, fams, "ipledger_releases_total", "reason="+string(reason)); got != float64(want) {
			t.Errorf("ipledger_releases_total{reason=%q} = %v, want %d", reason, got, want)
		}
	}
	livePods := 2 + adds - dels - manuals // pre1, pre2 and what the churn left
	for network, live := range map[string]int{"pods": livePods, "other": 1} {
		if got := value(t, fams, "ipledger_books_balance", "network="+network); got != 0 {
			t.Errorf("books balance of %s = %v, want 0", network, got)
		}
		if got := value(t, fams, "ipledger_leases_live", "network="+network); got != float64(live) {
			t.Errorf("live leases of %s = %v, want %d", network, got, live)
		}
	}
	// two addresses per lease in "pods" (dual stack); released ones cool for an hour
	for state, want := range map[string]int{"in_use": 2 * livePods, "cooling": 2 * (1 + dels + manuals), "usable": 253 + 254} {
		if got := value(t, fams, "ipledger_addresses", "network=pods", "state="+state); got != float64(want) {
			t.Errorf("ipledger_addresses{network=pods,state=%s} = %v, want %d", state, got, want)
		}
	}
	if got := value(t, fams, "ipledger_addresses", "network=pods", "state=free"); got != float64(253+254-2*livePods-2*(1+dels+manuals)) {
		t.Errorf("free addresses of pods = %v", got)
	}
	for _, c := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"verb=add", "result=ok"}, adds + 1 + 4},
		{[]string{"verb=del", "result=ok"}, dels + 1},
		{[]string{"verb=gc", "result=ok"}, 1},
		{[]string{"verb=release", "result=ok"}, manuals},
		{[]string{"verb=release", "result=not-found"}, 1},
		{[]string{"verb=unknown", "result=invalid"}, 1},
	} {
		if got := value(t, fams, "ipledger_requests_total", c.labels...); got != c.want {
			t.Errorf("ipledger_requests_total%v = %v, want %v", c.labels, got, c.want)
		}
	}
	if got := value(t, fams, "ipledger_request_duration_seconds", "verb=add"); got != adds+1+4 {
		t.Errorf("ADD latency histogram holds %v samples, want %d", got, adds+1+4)
	}
	if got := value(t, fams, "ipledger_spool_applied_total"); got != 1 {
		t.Errorf("spool applied = %v, want 1", got)
	}
	if got := value(t, fams, "ipledger_spool_backlog"); got != 0 {
		t.Errorf("spool backlog = %v, want 0", got)
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "ipledger_reconcile_rounds_total", "ipledger_runtime_errors_total", "ipledger_leases_stranded", "ipledger_leases_suspect", "ipledger_leases_leaked", "ipledger_clock_steps_total"} {
		if fams[name] == nil {
			t.Errorf("no metric %s", name)
		}
	}
	// bounded labels: no series carries the unknown verb's name
	if _, body := get(t, "http://"+addr+"/metrics"); strings.Contains(body, "frobnicate") {
		t.Error("an unknown verb became a label value")
	}
	if code, body := get(t, "http://"+addr+"/healthz"); code != 200 {
		t.Errorf("/healthz: %d %s", code, body)
	}
	if code, body := get(t, "http://"+addr+"/readyz"); code != 200 {
		t.Errorf("/readyz: %d %s", code, body)
	}
}

// TestReadyzRuntimeUnreachable: with a runtime configured that does not answer, the
// agent is alive (/healthz) but not ready (/readyz names the runtime), the failed
// runtime calls are counted, and reconcile rounds are counted as failed.
func TestReadyzRuntimeUnreachable(t *testing.T) {
	addr := netenv.FreeAddr(t)
	agentenv.Start(t, agentenv.Options{Args: []string{"--metrics-addr", addr, "--cri-endpoint", "unix://" + t.TempDir() + "/none.sock", "--reconcile-interval", "100ms", "--release-grace", "1s"}})
	if code, _ := get(t, "http://"+addr+"/healthz"); code != 200 {
		t.Fatalf("/healthz: %d", code)
	}
	code, body := get(t, "http://"+addr+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "runtime") {
		t.Fatalf("/readyz with the runtime down: %d %q, want 503 naming the runtime", code, body)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		fams := scrape(t, addr)
		failed := value(t, fams, "ipledger_reconcile_rounds_total", "outcome=failed")
		listErrs := value(t, fams, "ipledger_runtime_errors_total", "call=list")
		if failed >= 2 && listErrs >= 2 && value(t, fams, "ipledger_runtime_up") == 0 && value(t, fams, "ipledger_reconcile_rounds_total", "outcome=ok") == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: %v failed rounds, %v list errors; want at least 2 of each and no ok round", failed, listErrs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestHandedOverCallsCounted: a CNI call a plugin hands over (op cni) counts as verb
// cni, ok when the agent ran it whatever its CNI outcome, and its ADD or DEL counts as
// add or del like any other; a call that fails in the configuration reaches no verb.
func TestHandedOverCallsCounted(t *testing.T) {
	addr := netenv.FreeAddr(t)
	a := agentenv.Start(t, agentenv.Options{Args: []string{"--metrics-addr", addr}})
	conf := func(ranges string) []byte {
		return []byte(`{"cniVersion":"1.0.0","name":"handed","ipam":` + a.IPAM(ranges) + `}`)
	}
	good := conf(`[[{"subnet":"10.96.0.0/24"}]]`)
	for _, c := range []struct {
		call api.CNICall
		exit int
	}{
		{api.CNICall{Command: "ADD", ContainerID: "h1", NetNS: "/proc/1/ns/net", IfName: "eth0", Path: "/opt/cni/bin", Stdin: good}, 0},
		{api.CNICall{Command: "DEL", ContainerID: "h1", IfName: "eth0", Path: "/opt/cni/bin", Stdin: good}, 0},
		{api.CNICall{Command: "ADD", ContainerID: "h2", NetNS: "/proc/1/ns/net", IfName: "eth0", Path: "/opt/cni/bin", Stdin: conf(`[[{"subnet":"banana"}]]`)}, 1},
	} {
		c.call.NetNSID = api.NetNS{Path: c.call.NetNS, Dev: 4, Ino: 1}
		c.call.SelfNetNS = api.NetNS{Path: "/proc/self/ns/net", Dev: 4, Ino: 2}
		resp, err := a.Call(api.Request{Op: api.OpCNI, CNI: &c.call})
		if err != nil || resp.CNI == nil || resp.CNI.Exit != c.exit {
			t.Fatalf("%s %s: %v %+v, want exit %d", c.call.Command, c.call.ContainerID, err, resp, c.exit)
		}
	}
	// one scrape: the agent counts a request before it answers it
	fams := scrape(t, addr)
	for _, c := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"verb=cni", "result=ok"}, 3},
		{[]string{"verb=add", "result=ok"}, 1},
		{[]string{"verb=del", "result=ok"}, 1},
	} {
		if got := value(t, fams, "ipledger_requests_total", c.labels...); got != c.want {
			t.Errorf("ipledger_requests_total%v = %v, want %v", c.labels, got, c.want)
		}
	}
	if got := value(t, fams, "ipledger_request_duration_seconds", "verb=cni"); got != 3 {
		t.Errorf("cni latency histogram holds %v samples, want 3", got)
	}
}
