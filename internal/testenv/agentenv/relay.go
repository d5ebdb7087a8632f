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
)

// Relay stands between clients and a real agent, on a socket of its own, and records
// the op of every request it sees. An Old relay answers op "cni" as the agent of the
// release before it answered (an unknown op), as a plugin meets an older agent during
// an upgrade; everything else it passes to the agent and back.
type Relay struct {
	Socket string
	mu     sync.Mutex
	ops    []string
}

// OldAgentAnswer is what an agent that does not know op "cni" answers it.
const OldAgentAnswer = `{"version":1,"error":{"code":"invalid","msg":"op \"cni\" is not one of add, del, check, gc, status, leases, audit, history, release, ping, doctor, blocks"},"released":0}` + "\n"

// StartRelay starts a relay to a's socket (old: refusing op "cni") until the test
// ends.
func (a *Agent) StartRelay(tb testing.TB, old bool) *Relay {
	tb.Helper()
	r := &Relay{Socket: filepath.Join(filepath.Dir(a.Socket), fmt.Sprintf("relay-old-%v.sock", old))}
	ln, err := net.Listen("unix", r.Socket)
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	tb.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				if err := r.serve(c, a.Socket, old); err != nil {
					tb.Errorf("relay: %v", err)
				}
			}()
		}
	}()
	return r
}

func (r *Relay) serve(c net.Conn, agentSocket string, old bool) error {
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
	if old && req.Op == api.OpCNI {
		_, err := io.WriteString(c, OldAgentAnswer)
		return err
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
