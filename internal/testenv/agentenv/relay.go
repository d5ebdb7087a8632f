package agentenv

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/spool"
)

// Relay stands between clients and a real agent, on a socket of its own, and records
// the op of every request it sees; what it does with a request depends on its mode.
type Relay struct {
	Socket string
	mu     sync.Mutex
	ops    []string
}

// OldAgentAnswer is what an agent that does not know op "cni" answers it.
const OldAgentAnswer = `{"version":1,"error":{"code":"invalid","msg":"op \"cni\" is not one of add, del, check, gc, status, leases, audit, history, release, ping, doctor, blocks"},"released":0}` + "\n"

// RelayMode is what a Relay does with the requests it records.
type RelayMode int

const (
	// Pass passes every request to the agent and its answer back.
	Pass RelayMode = iota
	// OldAgent answers op "cni" as the agent of the release before it answered (an
	// unknown op), as a plugin meets an older agent during an upgrade, and passes the
	// rest.
	OldAgent
	// Mute reads each request and never answers it: an agent that has hung with the
	// request taken. The relay's socket publishes the agent's spool, so a DEL that
	// meets it can be spooled.
	Mute
)

// StartRelay starts a relay in mode to a's socket until the test ends.
func (a *Agent) StartRelay(tb testing.TB, mode RelayMode) *Relay {
	tb.Helper()
	r := &Relay{Socket: filepath.Join(filepath.Dir(a.Socket), fmt.Sprintf("relay-%d.sock", mode))}
	ln, err := net.Listen("unix", r.Socket)
	if err != nil {
		tb.Fatal(err)
	}
	if mode == Mute {
		if err := spool.Publish(r.Socket, a.SpoolDir); err != nil {
			tb.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	tb.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				if err := r.serve(c, a.Socket, mode); err != nil {
					tb.Errorf("relay: %v", err)
				}
			})
		}
	})
	return r
}

func (r *Relay) serve(c net.Conn, agentSocket string, mode RelayMode) error {
	line, err := bufio.NewReaderSize(c, api.MaxRequest).ReadBytes('\n')
	if err != nil {
		return err
	}
	var req struct {
		Op string `json:"op"`
	}
	if err := json.Unmarshal(line, &req); err != nil {
		return err
	}
	r.mu.Lock()
	r.ops = append(r.ops, req.Op)
	r.mu.Unlock()
	switch {
	case mode == OldAgent && req.Op == api.OpCNI:
		_, err := io.WriteString(c, OldAgentAnswer)
		return err
	case mode == Mute:
		io.Copy(io.Discard, c) // until the client gives up
		return nil
	}
	a, err := net.Dial("unix", agentSocket)
	if err != nil {
		return err
	}
	defer a.Close()
	if _, err := a.Write(line); err != nil {
		return err
	}
	answer, err := bufio.NewReader(a).ReadBytes('\n')
	if err != nil {
		return err
	}
	_, err = c.Write(answer)
	return err
}

// Take returns the ops seen since the last Take.
func (r *Relay) Take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ops := r.ops
	r.ops = nil
	return ops
}
