// Package agentenv runs the real ipledger binaries for tests and benchmarks: it builds
// them once per source tree (bin.go), starts ipledgerd by PID with its own state directory and
// socket, and when the test ends stops it by PID and audits the ledger it left, so the
// test that breaks an invariant is the one that fails.
package agentenv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/store/walstore"
)

// RepoRoot is the module's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// PortmapPackage is the standard CNI port-mapping plugin, built from go.mod's
// containernetworking/plugins as `make build` builds it (bin/portmap).
const PortmapPackage = "github.com/containernetworking/plugins/plugins/meta/portmap"

// Options for Start.
type Options struct {
	// Args are extra ipledgerd flags.
	Args []string
	// NoAudit skips the audit at cleanup (for tests that break the books on purpose).
	NoAudit bool
	// Netns runs the agent inside this named network namespace (`ip netns exec`,
	// which execs ipledgerd in its own process: PID is still the agent's). Its
	// directory and socket are on the host's file system as usual.
	Netns string
}

// Agent is a running ipledgerd.
type Agent struct {
	tb       testing.TB
	Dir      string // holds state/, spool/ and the socket
	StateDir string
	SpoolDir string
	Socket   string
	Log      string
	opts     Options
	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{}
	exitErr  error
}

// Start starts ipledgerd in a fresh directory and waits until it answers.
func Start(tb testing.TB, opts Options) *Agent {
	tb.Helper()
	// unix socket paths are short: keep the directory under /tmp
	dir, err := os.MkdirTemp("/tmp", "ipl-")
	if err != nil {
		tb.Fatal(err)
	}
	a := &Agent{tb: tb, Dir: dir, StateDir: filepath.Join(dir, "state"), SpoolDir: filepath.Join(dir, "state", "spool"),
		Socket: filepath.Join(dir, "s.sock"), Log: filepath.Join(dir, "agent.log"), opts: opts}
	tb.Cleanup(func() {
		a.Stop()
		if !opts.NoAudit && !tb.Failed() {
			a.AuditFile()
		}
		if tb.Failed() {
			a.dumpLog()
		}
		os.RemoveAll(dir)
	})
	a.start()
	return a
}

func (a *Agent) start() {
	a.tb.Helper()
	logf, err := os.OpenFile(a.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		a.tb.Fatal(err)
	}
	args := append([]string{"--state-dir", a.StateDir, "--socket", a.Socket, "--spool-dir", a.SpoolDir, "--log-level", "debug"}, a.opts.Args...)
	cmd := exec.Command(filepath.Join(Bin(a.tb), "ipledgerd"), args...)
	if a.opts.Netns != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", a.opts.Netns, filepath.Join(Bin(a.tb), "ipledgerd")}, args...)...)
	}
	cmd.Stdout = logf
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		a.tb.Fatal(err)
	}
	done := make(chan struct{})
	a.mu.Lock()
	a.cmd, a.done = cmd, done
	a.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logf.Close()
		a.mu.Lock()
		a.exitErr = err
		a.mu.Unlock()
		close(done)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := api.Call(ctx, a.Socket, api.Request{Op: api.OpPing})
		cancel()
		if err == nil {
			return
		}
		select {
		case <-done:
			a.dumpLog()
			a.tb.Fatalf("ipledgerd exited at start: %v", a.exitErr)
		default:
		}
		if time.Now().After(deadline) {
			a.dumpLog()
			a.tb.Fatalf("ipledgerd did not answer on %s: %v", a.Socket, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// PID of the running agent (0 when stopped).
func (a *Agent) PID() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd == nil {
		return 0
	}
	return a.cmd.Process.Pid
}

func (a *Agent) signal(sig syscall.Signal) error {
	a.mu.Lock()
	cmd, done := a.cmd, a.done
	a.mu.Unlock()
	if cmd == nil {
		return nil
	}
	cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(40 * time.Second):
		cmd.Process.Kill()
		<-done
		return fmt.Errorf("ipledgerd (pid %d) did not exit within 40s of %v", cmd.Process.Pid, sig)
	}
	a.mu.Lock()
	err := a.exitErr
	a.cmd = nil
	a.mu.Unlock()
	return err
}

// Stop sends SIGTERM and waits; it returns the agent's exit error (nil for status 0).
func (a *Agent) Stop() error { return a.signal(syscall.SIGTERM) }

// Kill sends SIGKILL and waits.
func (a *Agent) Kill() { a.signal(syscall.SIGKILL) }

// Restart starts the agent again on the same state.
func (a *Agent) Restart() { a.tb.Helper(); a.start() }

func (a *Agent) dumpLog() {
	b, _ := os.ReadFile(a.Log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 60 {
		lines = lines[len(lines)-60:]
	}
	a.tb.Logf("ipledgerd log (last %d lines):\n%s", len(lines), strings.Join(lines, "\n"))
}

// Call sends one request.
func (a *Agent) Call(req api.Request) (*api.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return api.Call(ctx, a.Socket, req)
}

// Leases returns the live leases through `ipledgerctl leases -o json` (the contract).
func (a *Agent) Leases(tb testing.TB) []api.LeaseView {
	tb.Helper()
	var out []api.LeaseView
	a.ctl(tb, 0, &out, "leases", "-o", "json")
	return out
}

// Audit runs `ipledgerctl audit -o json` and checks its exit status against the verdict.
func (a *Agent) Audit(tb testing.TB) api.Audit {
	tb.Helper()
	var out api.Audit
	code := a.ctl(tb, -1, &out, "audit", "-o", "json")
	if (code == 0) != out.OK || (code != 0 && code != 1) {
		tb.Fatalf("ipledgerctl audit exited %d with ok=%v", code, out.OK)
	}
	return out
}

// ctl runs ipledgerctl against the agent and decodes its JSON output into v. want is
// the expected exit status, or -1 for any.
func (a *Agent) ctl(tb testing.TB, want int, v any, args ...string) int {
	tb.Helper()
	stdout, stderr, code := Ctl(tb, append([]string{"--socket", a.Socket}, args...)...)
	if want >= 0 && code != want {
		tb.Fatalf("ipledgerctl %v exited %d: %s", args, code, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), v); err != nil {
		tb.Fatalf("ipledgerctl %v: output is not JSON: %v\n%s\n%s", args, err, stdout, stderr)
	}
	return code
}

// Ctl runs the built ipledgerctl with args and returns its output and exit status;
// it fails tb only when the command could not run at all.
func Ctl(tb testing.TB, args ...string) (stdout, stderr string, code int) {
	tb.Helper()
	cmd := exec.Command(filepath.Join(Bin(tb), "ipledgerctl"), args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		tb.Fatal(err)
	}
	return o.String(), e.String(), code
}

// AuditFile opens the state file (the agent must be stopped) and checks the ledger's
// invariants, failing the test with every problem.
func (a *Agent) AuditFile() ledger.AuditReport {
	a.tb.Helper()
	st, err := walstore.Open(filepath.Join(a.StateDir, "ledger.db"))
	if err != nil {
		a.tb.Fatalf("audit: %v", err)
	}
	defer st.Close()
	l, err := ledger.Open(st, ledger.Options{})
	if err != nil {
		a.tb.Fatalf("audit: %v", err)
	}
	rep, err := l.Audit()
	if err != nil {
		a.tb.Fatalf("audit: %v", err)
	}
	if !rep.OK {
		a.tb.Errorf("ledger audit failed: problems %v, double assigned %v", rep.Problems, rep.DoubleAssigned)
	}
	return rep
}

// IPAM returns an `ipam` section for this agent with the given ranges JSON.
func (a *Agent) IPAM(ranges string) string {
	return fmt.Sprintf(`{"type":"ipledger","socket":%q,"spoolDir":%q,"ranges":%s}`, a.Socket, a.SpoolDir, ranges)
}
