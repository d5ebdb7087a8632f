package etcdenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/ipledger/ipledger/internal/testenv/debpkg"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// EtcdServer is Debian's etcd server package (3.4 on bookworm).
var EtcdServer = debpkg.Package{Name: "etcd-server", Files: []string{"/usr/bin/etcd"}}

// Cluster is an etcd cluster of separate etcd-server processes on 127.0.0.1.
type Cluster struct {
	tb      testing.TB
	bin     string
	members []*member
	cli     *clientv3.Client
}

type member struct {
	name, dir, log string
	client, peer   string
	args           []string

	mu   sync.Mutex
	cmd  *exec.Cmd     // nil while down
	done chan struct{} // closed when cmd has exited
}

// StartCluster starts an n-member cluster (n is 1 or 3 in practice; any n >= 1
// works) of Debian's etcd-server, installing the package if needed, and waits until
// every member is healthy. t.Cleanup audits the members (every running one holds the
// same keyspace hash) and stops them by PID.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	if n < 1 {
		tb.Fatalf("etcd: StartCluster(%d): need at least one member", n)
	}
	debpkg.Need(tb, EtcdServer)
	c := &Cluster{tb: tb, bin: EtcdServer.Files[0]}
	ports := netenv.FreePorts(tb, 2*n)
	base := tb.TempDir()
	var initial []string
	for i := range n {
		m := &member{
			name:   fmt.Sprintf("m%d", i),
			client: "http://127.0.0.1:" + strconv.Itoa(ports[2*i]),
			peer:   "http://127.0.0.1:" + strconv.Itoa(ports[2*i+1]),
		}
		m.dir = filepath.Join(base, m.name)
		m.log = filepath.Join(base, m.name+".log")
		initial = append(initial, m.name+"="+m.peer)
		c.members = append(c.members, m)
	}
	token := fmt.Sprintf("ipledger-test-%d", time.Now().UnixNano())
	for _, m := range c.members {
		m.args = []string{
			"--name", m.name,
			"--data-dir", m.dir,
			"--listen-client-urls", m.client,
			"--advertise-client-urls", m.client,
			"--listen-peer-urls", m.peer,
			"--initial-advertise-peer-urls", m.peer,
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-state", "new",
			"--initial-cluster-token", token,
			"--logger", "zap",
			"--log-outputs", "stderr",
			"--log-level", "warn",
		}
	}
	tb.Cleanup(c.cleanup)
	for i := range c.members {
		c.start(i)
	}
	for i := range c.members {
		c.waitHealthy(i)
	}
	tb.Logf("etcd: %d-member cluster of %s: %v", n, c.bin, c.Endpoints())
	return c
}

// Endpoints returns every member's client URL, member i at index i.
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.client
	}
	return out
}

// Size returns the number of members.
func (c *Cluster) Size() int { return len(c.members) }

// PID returns member i's process ID, 0 while it is down.
func (c *Cluster) PID(i int) int {
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return 0
	}
	return m.cmd.Process.Pid
}

// Kill sends SIGKILL to member i's process and waits for it to exit; its data stays
// for Restart.
func (c *Cluster) Kill(i int) {
	c.tb.Helper()
	c.signal(i, syscall.SIGKILL)
}

// Restart starts member i again (after Kill or Stop) from its data and waits until it
// is healthy.
func (c *Cluster) Restart(i int) {
	c.tb.Helper()
	c.start(i)
	c.waitHealthy(i)
}

// Stop stops every member with SIGTERM (SIGKILL after 20s) and waits for them.
func (c *Cluster) Stop() {
	c.tb.Helper()
	for i := range c.members {
		c.signal(i, syscall.SIGTERM)
	}
}

// Client returns a client of every member, closed when the test ends.
func (c *Cluster) Client() *clientv3.Client {
	c.tb.Helper()
	if c.cli == nil {
		cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			c.tb.Fatalf("etcd: client of %v: %v", c.Endpoints(), err)
		}
		c.cli = cli
	}
	return c.cli
}

// Leader returns the index of the member that leads the cluster now, asking the
// running members (a test kills it to force an election).
func (c *Cluster) Leader() int {
	c.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	for ctx.Err() == nil {
		for i, m := range c.members {
			if c.PID(i) == 0 {
				continue
			}
			st, err := c.Client().Status(ctx, m.client)
			if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
				return i
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.tb.Fatalf("etcd: no running member leads the cluster after %v", StartTimeout)
	return -1
}

// Compact discards the cluster's history before rev.
func (c *Cluster) Compact(tb testing.TB, rev int64) {
	tb.Helper()
	compact(tb, c.Client(), rev)
}

func (c *Cluster) start(i int) {
	c.tb.Helper()
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		return
	}
	logf, err := os.OpenFile(m.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.tb.Fatalf("etcd: log of member %s: %v", m.name, err)
	}
	cmd := exec.Command(c.bin, m.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The member dies with the test process even if cleanup never runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		c.tb.Fatalf("etcd: start member %s (%s): %v", m.name, c.bin, err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		logf.Close()
		close(done)
	}()
	m.cmd, m.done = cmd, done
}

func (c *Cluster) signal(i int, sig syscall.Signal) {
	c.tb.Helper()
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return
	}
	if err := m.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		c.tb.Errorf("etcd: signal %v to member %s (pid %d): %v", sig, m.name, m.cmd.Process.Pid, err)
	}
	select {
	case <-m.done:
	case <-time.After(20 * time.Second):
		m.cmd.Process.Kill()
		<-m.done
	}
	m.cmd, m.done = nil, nil
}

// waitHealthy polls member i's /health until it reports a leader.
func (c *Cluster) waitHealthy(i int) {
	c.tb.Helper()
	m := c.members[i]
	deadline := time.Now().Add(StartTimeout)
	hc := &http.Client{Timeout: 2 * time.Second}
	var last string
	for time.Now().Before(deadline) {
		m.mu.Lock()
		done := m.done
		m.mu.Unlock()
		if done == nil {
			c.tb.Fatalf("etcd: member %s is not running", m.name)
		}
		select {
		case <-done:
			c.tb.Fatalf("etcd: member %s exited while starting; log:\n%s", m.name, tail(m.log))
		default:
		}
		resp, err := hc.Get(m.client + "/health")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = string(b)
			if resp.StatusCode == http.StatusOK && strings.Contains(last, `"health":"true"`) {
				return
			}
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.tb.Fatalf("etcd: member %s not healthy after %v (last: %s); log:\n%s", m.name, StartTimeout, last, tail(m.log))
}

// cleanup audits the running members, then stops them all by PID and checks that
// none survives.
func (c *Cluster) cleanup() {
	var running []*member
	for _, m := range c.members {
		m.mu.Lock()
		if m.cmd != nil {
			running = append(running, m)
		}
		m.mu.Unlock()
	}
	if len(running) == len(c.members) {
		c.auditHashes()
	}
	if c.cli != nil {
		c.cli.Close()
	}
	var pids []int
	for i := range c.members {
		if pid := c.PID(i); pid != 0 {
			pids = append(pids, pid)
		}
	}
	c.Stop()
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err == nil {
			c.tb.Errorf("etcd: audit: member process %d still alive after Stop", pid)
		}
	}
}

// auditHashes checks that every member holds the same keyspace: HashKV at one
// revision agrees across members (replication kept them identical).
func (c *Cluster) auditHashes() {
	cli := c.Client()
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	st, err := cli.Status(ctx, c.members[0].client)
	if err != nil {
		c.tb.Errorf("etcd: audit: status of %s: %v", c.members[0].name, err)
		return
	}
	rev := st.Header.Revision
	var first uint32
	for i, m := range c.members {
		// A member that was restarted may still be catching up: wait for it.
		var h *clientv3.HashKVResponse
		for {
			h, err = cli.HashKV(ctx, m.client, rev)
			if err == nil || ctx.Err() != nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil {
			c.tb.Errorf("etcd: audit: HashKV of %s at %d: %v", m.name, rev, err)
			return
		}
		if i == 0 {
			first = h.Hash
		} else if h.Hash != first {
			c.tb.Errorf("etcd: audit: member %s's keyspace hash at revision %d is %x, member %s's %x: the replicas differ", m.name, rev, h.Hash, c.members[0].name, first)
		}
	}
}
