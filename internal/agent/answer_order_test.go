package agent

import (
	"net"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/memstore"
)

// countingConn is the agent's end of a connection that reads, when the agent writes
// its answer, how many requests the metrics have counted so far.
type countingConn struct {
	net.Conn
	onWrite func()
}

func (c countingConn) Write(b []byte) (int, error) {
	c.onWrite()
	return c.Conn.Write(b)
}

// TestRequestCountedBeforeAnswer: when the agent writes a request's answer, the request
// is already in ipledger_requests_total and its latency histogram (and a release it
// made, under its reason), so a scrape made after a caller has its answer sees it. Each
// verb that answers through a connection is checked at the moment of the write.
func TestRequestCountedBeforeAnswer(t *testing.T) {
	l := ledgertest.Open(t, memstore.New(), ledger.Options{})
	s, err := New(Config{Ledger: l, Socket: filepath.Join(t.TempDir(), "s.sock"), Logger: ledgertest.TestLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ranges := ledgertest.Ranges(t, `[[{"subnet":"10.251.0.0/24"}]]`)
	for _, c := range []struct {
		req           api.Request
		verb, result  string
		releaseReason ledger.Reason
	}{
		{api.Request{Op: api.OpAdd, Network: "net", ContainerID: "a", IfName: "eth0", Ranges: ranges}, "add", "ok", ""},
		{api.Request{Op: api.OpRelease, Network: "net", ContainerID: "a", IfName: "eth0", Detail: "test"}, "release", "ok", ledger.ReasonManual},
		{api.Request{Op: api.OpRelease, Network: "net", ContainerID: "a", IfName: "eth0"}, "release", "not-found", ""},
		{api.Request{Op: "frobnicate"}, "unknown", "invalid", ""},
	} {
		c.req.Version = api.Version
		requests := s.stats.requests.WithLabelValues(c.verb, c.result)
		before := counterValue(t, requests)
		beforeLat := sampleCount(t, s, c.verb)
		var released, beforeRel float64
		if c.releaseReason != "" {
			beforeRel = counterValue(t, s.stats.releases.WithLabelValues(string(c.releaseReason)))
		}
		var atWrite, atWriteRel float64
		var latSamples uint64
		agentEnd, client := net.Pipe()
		conn := countingConn{Conn: agentEnd, onWrite: func() {
			atWrite = counterValue(t, requests)
			latSamples = sampleCount(t, s, c.verb)
			if c.releaseReason != "" {
				atWriteRel = counterValue(t, s.stats.releases.WithLabelValues(string(c.releaseReason)))
			}
		}}
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.handleConn(t.Context(), &trackedConn{conn: conn})
		}()
		b, err := api.MarshalRequest(c.req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Write(append(b, '\n')); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64<<10)
		if _, err := client.Read(buf); err != nil {
			t.Fatalf("%s: reading the answer: %v", c.verb, err)
		}
		client.Close()
		<-done
		if atWrite != before+1 {
			t.Errorf("%s (%s): requests_total was %v when the answer was written, want %v (counted before answering)", c.verb, c.result, atWrite, before+1)
		}
		if latSamples != beforeLat+1 {
			t.Errorf("%s: the latency histogram held %d samples when the answer was written, want %d", c.verb, latSamples, beforeLat+1)
		}
		if c.releaseReason != "" {
			released = atWriteRel - beforeRel
			if released != 1 {
				t.Errorf("%s: releases_total{reason=%s} grew by %v when the answer was written, want 1", c.verb, c.releaseReason, released)
			}
		}
	}
}

// counterValue is the value of counter c.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	m := &dto.Metric{}
	if err := c.Write(m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// sampleCount is how many samples the latency histogram of verb holds.
func sampleCount(t *testing.T, s *Server, verb string) uint64 {
	t.Helper()
	m := &dto.Metric{}
	if err := s.stats.latency.WithLabelValues(verb).(prometheus.Metric).Write(m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}
