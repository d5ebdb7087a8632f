// Package etcdenv runs real etcd servers for tests, on 127.0.0.1 only, with their data
// in the test's TempDir, stopped when the test ends:
//
//   - StartEmbedded: an etcd server inside the test process
//     (go.etcd.io/etcd/server/v3/embed), which it can stop and start again.
//   - StartCluster: Debian's etcd-server binary (installed through debpkg), as one or
//     three member processes, each of which a test can SIGKILL (Kill) and start again
//     (Restart) by PID.
//
// Test code only: nothing in cmd/ may import it (it links the etcd server).
package etcdenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// StartTimeout bounds a server's start (generous: the machine may be busy).
const StartTimeout = 2 * time.Minute

// Embedded is an etcd server running inside the test process.
type Embedded struct {
	tb     testing.TB
	dir    string
	client string // http://127.0.0.1:port, https:// with TLS
	peer   string
	tls    *TLSFiles // the server's, nil without TLS
	ctls   *TLSFiles // the client's

	mu  sync.Mutex
	e   *embed.Etcd // nil while stopped
	cli *clientv3.Client
}

// StartEmbedded starts a one-member etcd on two free 127.0.0.1 ports with its data in
// a TempDir; t.Cleanup stops it.
func StartEmbedded(tb testing.TB) *Embedded {
	tb.Helper()
	return startEmbedded(tb, false)
}

// StartEmbeddedTLS is StartEmbedded with TLS on the client port: the server presents
// a certificate for 127.0.0.1 from a CA made for the test and requires a client
// certificate from the same CA; the files a client needs are returned.
func StartEmbeddedTLS(tb testing.TB) (*Embedded, TLSFiles) {
	tb.Helper()
	e := startEmbedded(tb, true)
	return e, *e.ctls
}

func startEmbedded(tb testing.TB, withTLS bool) *Embedded {
	tb.Helper()
	ports := netenv.FreePorts(tb, 2)
	base := tb.TempDir()
	e := &Embedded{
		tb:     tb,
		dir:    filepath.Join(base, "etcd"),
		client: "http://127.0.0.1:" + strconv.Itoa(ports[0]),
		peer:   "http://127.0.0.1:" + strconv.Itoa(ports[1]),
	}
	if withTLS {
		srv, cli := makePKI(tb, base)
		e.tls, e.ctls = &srv, &cli
		e.client = "https://127.0.0.1:" + strconv.Itoa(ports[0])
	}
	tb.Cleanup(func() {
		e.audit()
		e.Stop()
		if e.cli != nil {
			e.cli.Close()
		}
	})
	e.Start()
	return e
}

// Endpoints returns the server's client URL.
func (e *Embedded) Endpoints() []string { return []string{e.client} }

// Start starts the server again after Stop, with the same ports and data.
func (e *Embedded) Start() {
	e.tb.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.e != nil {
		return
	}
	cfg := embed.NewConfig()
	cfg.Name = "embedded"
	cfg.Dir = e.dir
	cu, _ := url.Parse(e.client)
	pu, _ := url.Parse(e.peer)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	if e.tls != nil {
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: e.tls.Cert, KeyFile: e.tls.Key, TrustedCAFile: e.tls.CA, ClientCertAuth: true}
	}
	// One member elects itself after an election timeout: 100 ms instead of
	// etcd's 1 s default (a start took 0.3 to 0.9 s, now 16 to 106 ms). With no
	// peer, nothing else depends on the timing.
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(filepath.Dir(e.dir), "etcd.log")}
	var srv *embed.Etcd
	var err error
	// The port may be briefly held by the previous run's closing listener.
	deadline := time.Now().Add(StartTimeout)
	for {
		srv, err = embed.StartEtcd(cfg)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		e.tb.Fatalf("etcd: start embedded server on %s: %v (log: %s)", e.client, err, cfg.LogOutputs[0])
	}
	select {
	case <-srv.Server.ReadyNotify():
	case err := <-srv.Err():
		srv.Close()
		e.tb.Fatalf("etcd: embedded server on %s failed while starting: %v", e.client, err)
	case <-time.After(StartTimeout):
		srv.Close()
		e.tb.Fatalf("etcd: embedded server on %s not ready after %v", e.client, StartTimeout)
	}
	e.e = srv
	e.tb.Logf("etcd: embedded server %s (data %s)", e.client, e.dir)
}

// Stop stops the server, keeping its data (Start brings it back).
func (e *Embedded) Stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.e == nil {
		return
	}
	e.e.Close()
	e.e = nil
}

// Client returns a client of the server, closed when the test ends.
func (e *Embedded) Client() *clientv3.Client {
	e.tb.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cli == nil {
		cfg := clientv3.Config{Endpoints: []string{e.client}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
		if e.ctls != nil {
			tc, err := transport.TLSInfo{CertFile: e.ctls.Cert, KeyFile: e.ctls.Key, TrustedCAFile: e.ctls.CA}.ClientConfig()
			if err != nil {
				e.tb.Fatalf("etcd: client TLS: %v", err)
			}
			cfg.TLS = tc
		}
		cli, err := clientv3.New(cfg)
		if err != nil {
			e.tb.Fatalf("etcd: client of %s: %v", e.client, err)
		}
		e.cli = cli
	}
	return e.cli
}

// Compact discards the server's history before rev (etcd's compaction, physical).
func (e *Embedded) Compact(tb testing.TB, rev int64) {
	tb.Helper()
	compact(tb, e.Client(), rev)
}

func compact(tb testing.TB, cli *clientv3.Client, rev int64) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	if _, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		tb.Fatalf("etcd: compact to revision %d: %v", rev, err)
	}
}

// audit checks, when the test ends, that a running server still answers and that its
// keyspace hashes consistently (a corrupt store fails HashKV).
func (e *Embedded) audit() {
	e.mu.Lock()
	running := e.e != nil
	e.mu.Unlock()
	if !running {
		return
	}
	cli := e.Client()
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	if _, err := cli.HashKV(ctx, e.client, 0); err != nil {
		e.tb.Errorf("etcd: audit: HashKV of %s: %v", e.client, err)
	}
}

// tail returns the last bytes of a log file, for failure messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(log %s: %v)", path, err)
	}
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}
