package kubeenv

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// APIServerOptions configures StartAPIServer.
type APIServerOptions struct {
	// StartTimeout bounds the bring-up of etcd and of each start of the apiserver
	// (default 2 minutes: the machine may be busy).
	StartTimeout time.Duration
	// Args are extra kube-apiserver flags (for example
	// "--etcd-compaction-interval=10s").
	Args []string
}

// APIServer is a control plane without nodes: etcd and kube-apiserver only, on
// 127.0.0.1 at random ports, with certificates made for the test. Nothing else
// runs and nothing on the host changes (no kubelet, no containerd, no host
// lock), so tests of API clients start in seconds and run in parallel. The
// processes are stopped by PID and the directory removed at tb.Cleanup.
type APIServer struct {
	// Dir holds pki/, etcd/, logs/ and the admin kubeconfig.
	Dir string
	// Kubeconfig is the admin's (system:masters) kubeconfig file.
	Kubeconfig string
	// URL is the apiserver's https URL; EtcdURL etcd's client URL.
	URL, EtcdURL string

	tb   testing.TB
	opts APIServerOptions
	pki  *pki
	port int
	args []string
	*runner
}

const apiserverName = "kube-apiserver"

// StartAPIServer builds (or takes from the cache) the Kubernetes binaries,
// starts etcd and kube-apiserver and waits until the apiserver is ready.
func StartAPIServer(tb testing.TB, opts APIServerOptions) *APIServer {
	tb.Helper()
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 2 * time.Minute
	}
	bin := Binaries(tb)
	dir, err := os.MkdirTemp("", "kubeapi")
	if err != nil {
		tb.Fatal(err)
	}
	a := &APIServer{Dir: dir, Kubeconfig: filepath.Join(dir, "admin.kubeconfig"), tb: tb, opts: opts, runner: newRunner(tb, dir, bin, opts.StartTimeout)}
	tb.Cleanup(a.cleanup)
	if err := a.start(); err != nil {
		a.dumpLogs()
		tb.Fatal(err)
	}
	return a
}

func (a *APIServer) start() error {
	var err error
	if a.pki, err = newPKI(filepath.Join(a.Dir, "pki")); err != nil {
		return err
	}
	advertise, err := nodeIP()
	if err != nil {
		return err
	}
	if err := apiserverCerts(a.pki, advertise); err != nil {
		return err
	}
	if a.port, err = netenv.FreePort(); err != nil {
		return err
	}
	a.URL = fmt.Sprintf("https://127.0.0.1:%d", a.port)
	if err := a.pki.kubeconfig(a.Kubeconfig, a.URL, "admin"); err != nil {
		return err
	}
	if a.EtcdURL, err = a.startEtcd(filepath.Join(a.Dir, "etcd")); err != nil {
		return err
	}
	a.args = append(apiserverArgs(a.pki, a.EtcdURL, advertise, a.port, ServiceCIDR), "--authorization-mode", "RBAC")
	a.args = append(a.args, a.opts.Args...)
	return a.Start()
}

// Config returns a new admin rest.Config for the apiserver.
func (a *APIServer) Config() *rest.Config {
	return &rest.Config{
		Host: a.URL,
		TLSClientConfig: rest.TLSClientConfig{
			CAFile:   a.pki.path("ca.crt"),
			CertFile: a.pki.path("admin.crt"),
			KeyFile:  a.pki.path("admin.key"),
		},
	}
}

// PID is the running kube-apiserver's process ID.
func (a *APIServer) PID() int { return a.pid(apiserverName) }

// StopGrace is how long Stop waits after SIGTERM before SIGKILL: kube-apiserver
// stops listening at once but keeps a connection with a running watch open until
// its 60 s shutdown timeout.
const StopGrace = 3 * time.Second

// Stop stops kube-apiserver by PID (SIGTERM; SIGKILL after StopGrace) and waits
// for it to exit. etcd keeps running, so Start brings the same data back.
func (a *APIServer) Stop() { a.stopProcWithin(apiserverName, StopGrace) }

// Kill kills kube-apiserver by PID with SIGKILL (a crash) and waits for it to
// exit.
func (a *APIServer) Kill() { a.stopProcWithin(apiserverName, 0) }

// Start starts kube-apiserver (again) on the same port and waits until it is
// ready.
func (a *APIServer) Start() error {
	if a.procErr(apiserverName) == nil {
		return fmt.Errorf("kubeenv: kube-apiserver already running (pid %d)", a.PID())
	}
	if err := a.spawn(apiserverName, a.args...); err != nil {
		return err
	}
	return a.waitReady()
}

// Restart stops kube-apiserver by PID and starts it again: clients see their
// connections broken and refused until it is ready again.
func (a *APIServer) Restart() error {
	old := a.PID()
	t0 := time.Now()
	a.Stop()
	if err := a.Start(); err != nil {
		return err
	}
	a.tb.Logf("kubeenv: kube-apiserver restarted (pid %d -> %d) in %v", old, a.PID(), time.Since(t0).Round(time.Millisecond))
	return nil
}

// Kubectl runs kubectl as admin and returns its stdout; the error carries
// stderr.
func (a *APIServer) Kubectl(args ...string) (string, error) {
	return kubectl(a.bin, a.Kubeconfig, nil, args...)
}

// KubectlIn is Kubectl with stdin.
func (a *APIServer) KubectlIn(stdin []byte, args ...string) (string, error) {
	return kubectl(a.bin, a.Kubeconfig, stdin, args...)
}

// Log returns the last n lines of a component's log (etcd, kube-apiserver).
func (a *APIServer) Log(name string, n int) string {
	return logTail(filepath.Join(a.Dir, "logs", name+".log"), n)
}

// waitReady polls /readyz with the admin's certificate until it answers ok.
func (a *APIServer) waitReady() error {
	ca, err := os.ReadFile(a.pki.path("ca.crt"))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(a.pki.path("admin.crt"), a.pki.path("admin.key"))
	if err != nil {
		return err
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	deadline := time.Now().Add(a.opts.StartTimeout)
	var last error
	for time.Now().Before(deadline) {
		if err := a.procErr(apiserverName); err != nil {
			return err
		}
		resp, err := client.Get(a.URL + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && strings.TrimSpace(string(b)) == "ok" {
				return nil
			}
			last = fmt.Errorf("readyz: %s: %s", resp.Status, tail(string(b), 5))
		} else {
			last = err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("kubeenv: kube-apiserver not ready after %v: %v", a.opts.StartTimeout, last)
}

func (a *APIServer) dumpLogs() {
	for _, n := range []string{"etcd", apiserverName} {
		if s := a.Log(n, 25); s != "" {
			a.tb.Logf("---- %s log, last lines:\n%s", n, s)
		}
	}
}

// cleanup stops kube-apiserver and etcd by PID, checks both exited, and removes
// the directory.
func (a *APIServer) cleanup() {
	if a.tb.Failed() {
		a.dumpLogs()
	}
	for _, n := range []string{apiserverName, "etcd"} {
		a.stopProc(n)
	}
	a.mu.Lock()
	for n, p := range a.procs {
		select {
		case <-p.done:
		default:
			a.tb.Errorf("kubeenv cleanup: %s (pid %d) still running", n, p.cmd.Process.Pid)
		}
	}
	a.mu.Unlock()
	if err := os.RemoveAll(a.Dir); err != nil {
		a.tb.Errorf("kubeenv cleanup: %v", err)
	}
}
