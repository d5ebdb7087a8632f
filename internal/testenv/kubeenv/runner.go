package kubeenv

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// runner starts and stops a cluster's components by PID, each in its own process
// group with its log in DIR/logs/NAME.log.
type runner struct {
	tb      testing.TB
	logDir  string
	bin     string
	timeout time.Duration // bring-up bound of each component

	mu    sync.Mutex
	procs map[string]*proc
}

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	log  string
}

func newRunner(tb testing.TB, dir, bin string, timeout time.Duration) *runner {
	return &runner{tb: tb, logDir: filepath.Join(dir, "logs"), bin: bin, timeout: timeout, procs: map[string]*proc{}}
}

// spawn starts a component by PID in its own process group, log in logs/NAME.log
// (appended to, so a restarted component's log follows its predecessor's).
func (c *runner) spawn(name string, args ...string) error {
	return c.spawnPath(name, filepath.Join(c.bin, name), args...)
}

// spawnPath is spawn of the program at path (a wrapper such as nsenter, or a
// binary outside the Kubernetes build), its log in logs/NAME.log.
func (c *runner) spawnPath(name, path string, args ...string) error {
	if err := os.MkdirAll(c.logDir, 0o755); err != nil {
		return err
	}
	logPath := filepath.Join(c.logDir, name+".log")
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Env = append(os.Environ(), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return fmt.Errorf("kubeenv: start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() {
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	c.mu.Lock()
	c.procs[name] = p
	c.mu.Unlock()
	c.tb.Logf("kubeenv: %s started, pid %d", name, cmd.Process.Pid)
	return nil
}

// pid is the named component's PID (0 when not started).
func (c *runner) pid(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.procs[name]; p != nil {
		return p.cmd.Process.Pid
	}
	return 0
}

// procErr is non-nil when the named component has exited.
func (c *runner) procErr(name string) error {
	c.mu.Lock()
	p := c.procs[name]
	c.mu.Unlock()
	if p == nil {
		return fmt.Errorf("kubeenv: %s not started", name)
	}
	select {
	case <-p.done:
		return fmt.Errorf("kubeenv: %s exited: %v\n%s", name, p.err, logTail(p.log, 30))
	default:
		return nil
	}
}

// stopProc stops one component by PID (SIGTERM, SIGKILL after 20 s) and waits
// for it to exit.
func (c *runner) stopProc(name string) { c.stopProcWithin(name, 20*time.Second) }

// stopProcWithin stops one component by PID: SIGTERM, SIGKILL after grace (at
// once when grace is 0), and waits for it to exit.
func (c *runner) stopProcWithin(name string, grace time.Duration) {
	c.mu.Lock()
	p := c.procs[name]
	c.mu.Unlock()
	if p == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	if grace <= 0 {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		c.tb.Logf("kubeenv: %s (pid %d) still running %v after SIGTERM, killed", name, p.cmd.Process.Pid, grace)
	}
}

func (c *runner) waitHTTP(name, url string) error {
	deadline := time.Now().Add(c.timeout)
	var last error
	for time.Now().Before(deadline) {
		if err := c.procErr(name); err != nil {
			return err
		}
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			last = fmt.Errorf("status %s", resp.Status)
		} else {
			last = err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("kubeenv: %s not healthy at %s after %v: %v", name, url, c.timeout, last)
}

// startEtcd starts etcd (one member, loopback, no fsync: a test's data) with its
// data in dataDir and returns its client URL once it is healthy.
func (c *runner) startEtcd(dataDir string) (string, error) {
	client, err := netenv.FreePort()
	if err != nil {
		return "", err
	}
	peer, err := netenv.FreePort()
	if err != nil {
		return "", err
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", client)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	if err := c.spawn("etcd", "--name", "node", "--data-dir", dataDir,
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "node="+peerURL, "--unsafe-no-fsync", "--log-level", "warn"); err != nil {
		return "", err
	}
	if err := c.waitHTTP("etcd", etcdURL+"/health"); err != nil {
		return "", err
	}
	return etcdURL, nil
}

// apiserverArgs are the kube-apiserver flags both environments use: etcd at
// etcdURL, serving on 127.0.0.1:port with the certificates of p, RBAC, the
// Services' addresses from serviceCIDRs (one CIDR, or IPv4,IPv6).
func apiserverArgs(p *pki, etcdURL, advertise string, port int, serviceCIDRs string) []string {
	return []string{
		"--etcd-servers", etcdURL, "--bind-address", "127.0.0.1", "--advertise-address", advertise,
		"--secure-port", fmt.Sprint(port),
		"--tls-cert-file", p.path("apiserver.crt"), "--tls-private-key-file", p.path("apiserver.key"),
		"--client-ca-file", p.path("ca.crt"),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", p.path("sa.pub"), "--service-account-signing-key-file", p.path("sa.key"),
		"--service-cluster-ip-range", serviceCIDRs,
		"--endpoint-reconciler-type", "none",
		"--profiling=false", "--v", "0",
	}
}

// apiserverCert issues the apiserver's serving certificate (loopback, the node's
// address, the in-cluster names) and the admin's client certificate.
func apiserverCerts(p *pki, nodeIP string) error {
	lo := []net.IP{net.ParseIP("127.0.0.1")}
	if err := p.issue("apiserver", "kube-apiserver", nil, true, append(lo, net.ParseIP("10.96.0.1"), net.ParseIP(nodeIP)), []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}); err != nil {
		return err
	}
	if err := p.issue("admin", "kubernetes-admin", []string{"system:masters"}, false, nil, nil); err != nil {
		return err
	}
	return p.serviceAccountKey()
}
