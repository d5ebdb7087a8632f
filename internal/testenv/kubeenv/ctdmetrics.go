package kubeenv

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ContainerdMetricsAddr is where each node's containerd serves its Prometheus
// metrics: on the node's own loopback, so the nodes do not share a port.
const ContainerdMetricsAddr = "127.0.0.1:1338"

// ContainerdMetrics scrapes the node's containerd: its metric families by
// name, e.g. containerd_cri_network_plugin_operations_duration_seconds_seconds,
// the time each CNI ADD (operation_type set_up_pod) and DEL (tear_down_pod)
// took as containerd measures it.
func (n *Node) ContainerdMetrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	return n.Metrics(ctx, "http://"+ContainerdMetricsAddr+"/v1/metrics")
}

// Metrics scrapes the Prometheus text at url, dialled from inside the node's
// network namespace (so a loopback address is the node's own): its metric
// families by name.
func (n *Node) Metrics(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		// the address is the node's loopback: dial from inside its namespace
		DialContext: func(_ context.Context, network, addr string) (net.Conn, error) {
			return n.Host.Dial(network, addr, 10*time.Second)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: metrics %s: %w", n.Name, url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: metrics %s: %s", n.Name, url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: metrics %s: %w", n.Name, url, err)
	}
	return fams, nil
}
