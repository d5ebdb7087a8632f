//go:build kubelet

package kubenodes_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// cniOpMetric is containerd's histogram of its CNI calls' durations, by
// operation_type: set_up_pod (the ADD of a sandbox's networks) and
// tear_down_pod (their DEL). Its timer is around the CNI library's call, so it
// holds the plugins' whole work and nothing of the rest of RunPodSandbox: the
// pod network's own share of a pod's startup, the same clock for every network.
const cniOpMetric = "network_plugin_operations_duration_seconds"

// cniHist is one operation's histogram, summed over the nodes: the finite
// bucket bounds in order, the cumulative count at each, the count and the sum
// in seconds.
type cniHist struct {
	bounds, cum []float64
	count, sum  float64
}

// cniScrape is one scrape of every node's containerd: its ADD and DEL
// histograms, and the DELs it counted as failed
// (network_plugin_operations_errors_total, tear_down_pod). containerd serves
// an operation's histogram only once it has timed one, so a missing one is
// empty here; the burst checks the counts it expects.
type cniScrape struct {
	add, del  cniHist
	delErrors float64
}

// containerdScrape scrapes every node's containerd once.
func (cl *cluster) containerdScrape() cniScrape {
	cl.T.Helper()
	var fams []map[string]*dto.MetricFamily
	h := cl.hists(func(nd *kubeenv.Node) (map[string]*dto.MetricFamily, error) {
		f, err := nd.ContainerdMetrics(context.Background())
		fams = append(fams, f)
		return f, err
	}, cniOpMetric, "operation_type")
	s := cniScrape{add: h["set_up_pod"], del: h["tear_down_pod"]}
	for _, f := range fams {
		for name, fam := range f {
			if !strings.Contains(name, "network_plugin_operations_errors") {
				continue
			}
			for _, m := range fam.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "operation_type" && l.GetValue() == "tear_down_pod" {
						s.delErrors += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	return s
}

// agentMetricsURL is where the manifests' agents serve /metrics
// (--metrics-addr), on the node's loopback.
const agentMetricsURL = "http://127.0.0.1:9780/metrics"

// agentOpMetric is the agent's histogram of the time it takes to answer a
// request, by verb (add and del: a forwarded IPAM ADD or DEL, its durable
// commit included), from reading the request to writing the answer.
const agentOpMetric = "ipledger_request_duration_seconds"

// agentHists scrapes every node's agent for its ADD and DEL answer times.
func (cl *cluster) agentHists() (add, del cniHist) {
	cl.T.Helper()
	h := cl.hists(func(nd *kubeenv.Node) (map[string]*dto.MetricFamily, error) {
		return nd.Metrics(context.Background(), agentMetricsURL)
	}, agentOpMetric, "verb")
	return h["add"], h["del"]
}

// hists scrapes every node and sums the histograms of the family whose name
// contains metric by the value of their label.
func (cl *cluster) hists(scrape func(*kubeenv.Node) (map[string]*dto.MetricFamily, error), metric, label string) map[string]cniHist {
	t := cl.T
	t.Helper()
	out := map[string]cniHist{}
	for _, nd := range cl.Nodes {
		fams, err := scrape(nd)
		if err != nil {
			t.Fatal(err)
		}
		for name, f := range fams {
			if !strings.Contains(name, metric) {
				continue
			}
			for _, m := range f.GetMetric() {
				h := m.GetHistogram()
				if h == nil {
					t.Fatalf("%s: %s is a %s, not a histogram", nd.Name, name, f.GetType())
				}
				var one cniHist
				for _, b := range h.GetBucket() {
					if !math.IsInf(b.GetUpperBound(), 1) {
						one.bounds = append(one.bounds, b.GetUpperBound())
						one.cum = append(one.cum, float64(b.GetCumulativeCount()))
					}
				}
				one.count, one.sum = float64(h.GetSampleCount()), h.GetSampleSum()
				for _, l := range m.GetLabel() {
					if l.GetName() == label {
						out[l.GetValue()] = out[l.GetValue()].plus(t, one)
					}
				}
			}
		}
	}
	return out
}

// plus is h and o summed bucket by bucket; an empty histogram takes o's bounds.
func (h cniHist) plus(tb testing.TB, o cniHist) cniHist {
	tb.Helper()
	return h.combine(tb, o, 1)
}

// minus is what h counted since o, an earlier scrape of the same histograms.
func (h cniHist) minus(tb testing.TB, o cniHist) cniHist {
	tb.Helper()
	return h.combine(tb, o, -1)
}

func (h cniHist) combine(tb testing.TB, o cniHist, sign float64) cniHist {
	tb.Helper()
	if len(o.bounds) == 0 {
		return h
	}
	if len(h.bounds) == 0 {
		h.bounds, h.cum = o.bounds, make([]float64, len(o.bounds))
	}
	if !slices.Equal(h.bounds, o.bounds) {
		tb.Fatalf("histograms with buckets %v and %v", h.bounds, o.bounds)
	}
	r := cniHist{bounds: h.bounds, cum: make([]float64, len(h.cum)), count: h.count + sign*o.count, sum: h.sum + sign*o.sum}
	for i := range h.cum {
		r.cum[i] = h.cum[i] + sign*o.cum[i]
	}
	return r
}

// mean is the operations' mean duration (exact: the histogram's sum over its
// count); 0 when none was counted.
func (h cniHist) mean() time.Duration {
	if h.count <= 0 {
		return 0
	}
	return time.Duration(h.sum / h.count * float64(time.Second))
}

// quantile is the q-quantile, interpolated linearly inside its bucket as
// PromQL's histogram_quantile does: as coarse as the buckets (containerd's are
// Prometheus' defaults, 5 ms to 10 s). Above the last finite bound it is that
// bound.
func (h cniHist) quantile(q float64) time.Duration {
	if h.count <= 0 || len(h.bounds) == 0 {
		return 0
	}
	rank := q * h.count
	lower, below := 0.0, 0.0
	for i, c := range h.cum {
		if c >= rank {
			v := lower
			if c > below {
				v += (h.bounds[i] - lower) * (rank - below) / (c - below)
			}
			return time.Duration(v * float64(time.Second))
		}
		lower, below = h.bounds[i], c
	}
	return time.Duration(h.bounds[len(h.bounds)-1] * float64(time.Second))
}

// TestCNIHist: scrapes subtract and pool bucket by bucket, the mean is the
// sum over the count, and a quantile is interpolated inside its bucket.
func TestCNIHist(t *testing.T) {
	bounds := []float64{0.1, 0.5, 1, 5}
	before := cniHist{bounds: bounds, cum: []float64{1, 2, 2, 2}, count: 2, sum: 0.3}
	after := cniHist{bounds: bounds, cum: []float64{1, 6, 10, 12}, count: 12, sum: 10.3}
	d := after.minus(t, before)
	if want := (cniHist{bounds: bounds, cum: []float64{0, 4, 8, 10}, count: 10, sum: 10}); fmt.Sprint(d) != fmt.Sprint(want) {
		t.Fatalf("after - before = %v, want %v", d, want)
	}
	if got := d.mean(); got != time.Second {
		t.Errorf("mean = %v, want 1s", got)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{
		{0.2, 300 * time.Millisecond},   // rank 2 of the 4 in (0.1, 0.5]
		{0.4, 500 * time.Millisecond},   // the bucket's top
		{0.6, 750 * time.Millisecond},   // rank 6: half of (0.5, 1]
		{0.9, 3 * time.Second},          // rank 9: half of (1, 5]
		{0.99, 4800 * time.Millisecond}, // rank 9.9
	} {
		if got := d.quantile(c.q); (got - c.want).Abs() > time.Millisecond {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	over := cniHist{bounds: bounds, cum: []float64{0, 0, 0, 1}, count: 2, sum: 20}
	if got := over.quantile(0.99); got != 5*time.Second {
		t.Errorf("a quantile above the last bound = %v, want the bound, 5s", got)
	}
	var pooled cniHist
	pooled = pooled.plus(t, d).plus(t, d)
	if pooled.count != 20 || pooled.cum[3] != 20 || pooled.mean() != time.Second {
		t.Errorf("two rounds pooled = %v, want each bucket doubled and the mean kept", pooled)
	}
}
