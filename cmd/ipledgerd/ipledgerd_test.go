package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/spool"
	"github.com/ipledger/ipledger/internal/testenv"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
)

// runAgent runs a second ipledgerd on socket that is expected to refuse to
// start, and returns its exit status and output.
func runAgent(t *testing.T, socket string) (int, string) {
	t.Helper()
	return runAgentArgs(t, "--socket", socket)
}

// runAgentArgs runs an ipledgerd with a state directory of its own and args,
// expected to exit within 20 s, and returns its exit status and output.
func runAgentArgs(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(agentenv.Bin(t), "ipledgerd"), append([]string{"--state-dir", t.TempDir(), "--takeover-timeout", "300ms"}, args...)...)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

// TestSocket: the socket is mode 0600; a stale socket (agent SIGKILLed) is removed at
// start; a live one (another agent) or a file that is not a socket is refused and left
// alone.
func TestSocket(t *testing.T) {
	a := agentenv.Start(t, agentenv.Options{})
	fi, err := os.Stat(a.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want a socket with 0600", fi.Mode())
	}

	code, out := runAgent(t, a.Socket)
	if code == 0 || !strings.Contains(out, "another ipledgerd") || !strings.Contains(out, a.Socket) {
		t.Fatalf("second agent on a live socket exited %d: %s", code, out)
	}
	if _, err := a.Call(api.Request{Op: api.OpPing}); err != nil {
		t.Fatalf("the first agent no longer answers after the second was refused: %v", err)
	}

	a.Kill()
	if _, err := os.Lstat(a.Socket); err != nil {
		t.Fatalf("SIGKILL should leave the socket file behind: %v", err)
	}
	a.Restart() // fails the test unless the stale socket is replaced
	if fi, err := os.Stat(a.Socket); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket after restart: %v %v", fi.Mode(), err)
	}

	plain := filepath.Join(t.TempDir(), "not-a-socket")
	if err := os.WriteFile(plain, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out = runAgent(t, plain)
	if code == 0 || !strings.Contains(out, "not a socket") || !strings.Contains(out, plain) {
		t.Fatalf("agent on a regular file exited %d: %s", code, out)
	}
	if b, err := os.ReadFile(plain); err != nil || string(b) != "precious" {
		t.Fatalf("the regular file was touched: %q %v", b, err)
	}
}

// TestSIGTERMDrains: a request the agent has accepted but not finished reading when
// SIGTERM arrives is still answered, the agent exits 0, and what it answered is
// durable.
func TestSIGTERMDrains(t *testing.T) {
	a := agentenv.Start(t, agentenv.Options{})
	sets := ledgertest.Ranges(t, `[[{"subnet":"10.87.0.0/24"}]]`)
	const inflight = 5
	conns := make([]net.Conn, inflight)
	lines := make([][]byte, inflight)
	for i := range conns {
		c, err := net.Dial("unix", a.Socket)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		b, _ := json.Marshal(api.Request{Version: api.Version, Op: api.OpAdd, Network: "drain", ContainerID: "d" + string(rune('a'+i)), IfName: "eth0", Ranges: sets})
		half := len(b) / 2
		if _, err := c.Write(b[:half]); err != nil {
			t.Fatal(err)
		}
		conns[i], lines[i] = c, append(b[half:], '\n')
	}
	time.Sleep(200 * time.Millisecond) // the agent accepts them and waits for the rest
	if err := syscall.Kill(a.PID(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	// new connections are refused while the agent drains
	if _, err := api.Call(context.Background(), a.Socket, api.Request{Op: api.OpPing}); err == nil {
		t.Fatal("the agent accepted a new request after SIGTERM")
	}
	got := map[string]string{}
	for i, c := range conns {
		if _, err := c.Write(lines[i]); err != nil {
			t.Fatalf("finishing request %d: %v", i, err)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(c).ReadBytes('\n')
		if err != nil {
			t.Fatalf("request %d in flight at SIGTERM got no answer: %v", i, err)
		}
		var resp api.Response
		if err := json.Unmarshal(line, &resp); err != nil || resp.Error != nil || resp.Lease == nil {
			t.Fatalf("request %d: %s", i, line)
		}
		got[resp.Lease.ContainerID] = resp.Lease.IPs[0]
	}
	if err := a.Stop(); err != nil {
		t.Fatalf("ipledgerd after SIGTERM: %v, want exit status 0", err)
	}
	a.Restart()
	leases := a.Leases(t)
	if len(leases) != inflight {
		t.Fatalf("after restart %d leases, want %d: %v", len(leases), inflight, leases)
	}
	for _, l := range leases {
		if got[l.ContainerID] != l.IPs[0] {
			t.Fatalf("lease %s holds %v, the agent answered %s", l.ContainerID, l.IPs, got[l.ContainerID])
		}
	}
}

// TestRefusedAgentLeavesSpool: a second agent refused because another serves the
// socket must not apply (and so steal into its own ledger) the DELs spooled for the
// running agent; the running agent applies them.
func TestRefusedAgentLeavesSpool(t *testing.T) {
	a := agentenv.Start(t, agentenv.Options{})
	sets := ledgertest.Ranges(t, `[[{"subnet":"10.88.0.0/24"}]]`)
	k := api.Key{Network: "sp", ContainerID: "victim", IfName: "eth0"}
	if _, err := a.Call(api.Request{Op: api.OpAdd, Network: k.Network, ContainerID: k.ContainerID, IfName: k.IfName, Ranges: sets}); err != nil {
		t.Fatal(err)
	}
	if err := spool.Write(a.SpoolDir, spool.Entry{Key: k, Spooled: time.Now(), CNIVerb: "DEL"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(agentenv.Bin(t), "ipledgerd"), "--state-dir", t.TempDir(), "--spool-dir", a.SpoolDir, "--socket", a.Socket, "--takeover-timeout", "300ms").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another ipledgerd") || !strings.Contains(string(out), "--takeover-timeout") {
		t.Fatalf("second agent: %v %s", err, out)
	}
	// the running agent applies the spool within its interval (2s)
	deadline := time.Now().Add(10 * time.Second)
	for len(a.Leases(t)) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the spooled DEL was not applied by the running agent (spool holds %d): leases %v", spool.Len(a.SpoolDir), a.Leases(t))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestTakeover: a new ipledgerd started on the state directory and socket of one that
// still runs (a DaemonSet rollover) waits for it, saying so in its log, instead of
// exiting; when the old one stops, the new one serves the same ledger. A new agent
// whose predecessor never stops gives up after --takeover-timeout with an error
// naming the state file and the flag.
func TestTakeover(t *testing.T) {
	a := agentenv.Start(t, agentenv.Options{})
	sets := ledgertest.Ranges(t, `[[{"subnet":"10.89.0.0/24"}]]`)
	resp, err := a.Call(api.Request{Op: api.OpAdd, Network: "to", ContainerID: "kept", IfName: "eth0", Ranges: sets})
	if err != nil || resp.Error != nil || resp.Lease == nil {
		t.Fatalf("ADD: %v %+v", err, resp)
	}
	ip := resp.Lease.IPs[0]
	bin := filepath.Join(agentenv.Bin(t), "ipledgerd")
	args := []string{"--state-dir", a.StateDir, "--spool-dir", a.SpoolDir, "--socket", a.Socket}

	t.Run("gives-up", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, bin, append(args, "--takeover-timeout", "1s")...).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Fatalf("new agent with its predecessor running: %v, want exit status 1; output:\n%s", err, out)
		}
		for _, want := range []string{"waiting for another ipledgerd to exit", "locked by another process", "--takeover-timeout"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		if _, err := a.Call(api.Request{Op: api.OpPing}); err != nil {
			t.Fatalf("the running agent stopped answering: %v", err)
		}
	})

	t.Run("waits", func(t *testing.T) {
		var out testenv.Buffer
		next := exec.Command(bin, append(args, "--takeover-timeout", "60s")...)
		next.Stdout, next.Stderr = &out, &out
		if err := next.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- next.Wait() }()
		t.Cleanup(func() {
			next.Process.Signal(syscall.SIGTERM)
			<-exited
			t.Logf("new agent's output:\n%s", out.String())
		})
		deadline := time.Now().Add(15 * time.Second)
		for !strings.Contains(out.String(), "waiting for another ipledgerd to exit") {
			select {
			case err := <-exited:
				t.Fatalf("the new agent exited while its predecessor ran: %v\n%s", err, out.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("the new agent does not say it waits:\n%s", out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := a.Stop(); err != nil {
			t.Fatalf("old agent: %v", err)
		}
		deadline = time.Now().Add(15 * time.Second)
		for {
			resp, err := a.Call(api.Request{Op: api.OpLeases})
			if err == nil && resp.Error == nil {
				if len(resp.Leases) != 1 || resp.Leases[0].ContainerID != "kept" || resp.Leases[0].IPs[0] != ip {
					t.Fatalf("the new agent serves %+v, want the lease kept at %s", resp.Leases, ip)
				}
				break
			}
			select {
			case err := <-exited:
				t.Fatalf("the new agent exited instead of taking over: %v\n%s", err, out.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("the new agent did not take over: %v\n%s", err, out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !strings.Contains(out.String(), "taking over") {
			t.Errorf("the new agent's log does not say it took over:\n%s", out.String())
		}
		next.Process.Signal(syscall.SIGTERM)
		if err := <-exited; err != nil {
			t.Fatalf("new agent after SIGTERM: %v", err)
		}
		exited <- nil // for the cleanup; a's own cleanup audits the file
	})
}

// TestReuseDelayAcrossRestart: an address released just before the agent restarts on
// the same boot becomes free again a reuse delay after its release, not a whole delay
// after the restart, and never earlier (invariant 9). One address in the pool, so an
// ADD succeeds exactly when it is free again.
func TestReuseDelayAcrossRestart(t *testing.T) {
	const delay = 6 * time.Second
	a := agentenv.Start(t, agentenv.Options{Args: []string{"--reuse-delay", delay.String()}})
	sets := ledgertest.Ranges(t, `[[{"subnet":"10.90.0.0/24","rangeStart":"10.90.0.7","rangeEnd":"10.90.0.7"}]]`)
	add := func(cid string) (*api.Response, error) {
		return a.Call(api.Request{Op: api.OpAdd, Network: "rd", ContainerID: cid, IfName: "eth0", Ranges: sets})
	}
	if resp, err := add("old"); err != nil || resp.Error != nil {
		t.Fatalf("ADD: %v %+v", err, resp)
	}
	released := time.Now() // the release happens after this
	if resp, err := a.Call(api.Request{Op: api.OpDel, Network: "rd", ContainerID: "old", IfName: "eth0"}); err != nil || resp.Error != nil {
		t.Fatalf("DEL: %v %+v", err, resp)
	}
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(delay / 2)
	restarted := time.Now() // the new agent opens its ledger after this
	a.Restart()
	for {
		resp, err := add("new")
		var ae *api.Error
		if errors.As(err, &ae) {
			resp, err = &api.Response{Error: ae}, nil
		}
		if err != nil {
			t.Fatal(err)
		}
		if resp.Error == nil {
			got := time.Now()
			if got.Sub(released) < delay {
				t.Fatalf("the address was given again %v after its release, before the reuse delay %v", got.Sub(released), delay)
			}
			// a whole delay from the restart would be restarted+6s; the release's
			// remaining time ends near restarted+3s
			if got.Sub(restarted) >= delay-time.Second {
				t.Fatalf("the address came back %v after the restart: the delay restarted instead of going on", got.Sub(restarted))
			}
			t.Logf("free again %v after the release, %v after the restart", got.Sub(released).Round(time.Millisecond), got.Sub(restarted).Round(time.Millisecond))
			return
		}
		if resp.Error.Code != api.CodeExhausted {
			t.Fatalf("ADD: code %q: %s", resp.Error.Code, resp.Error.Msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
