package main_test

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/ipledger/ipledger/internal/testenv/agentenv"
)

// TestDebugAddr (issue 35): --debug-addr serves Go's CPU profile (what the
// scale benchmark captures during a burst of pods).
func TestDebugAddr(t *testing.T) {
	a := agentenv.Start(t, agentenv.Options{Args: []string{"--debug-addr", "127.0.0.1:0"}})
	log, err := os.ReadFile(a.Log)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`msg="profiler on" debug_addr=(\S+)`).FindSubmatch(log)
	if m == nil {
		t.Fatalf("no \"profiler on\" line in the agent's log:\n%s", log)
	}
	resp, err := http.Get("http://" + string(m[1]) + "/debug/pprof/profile?seconds=1")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	// A CPU profile is a gzipped protobuf.
	if resp.StatusCode != http.StatusOK || !bytes.HasPrefix(body, []byte{0x1f, 0x8b}) {
		t.Fatalf("GET /debug/pprof/profile: %s, %d bytes starting %q", resp.Status, len(body), body[:min(len(body), 40)])
	}
}

// TestDebugAddrBad: an address the agent cannot listen on stops it with an
// error naming the flag.
func TestDebugAddrBad(t *testing.T) {
	code, out := runAgentArgs(t, "--socket", filepath.Join(t.TempDir(), "s.sock"), "--debug-addr", "no-such-host.invalid:x")
	if code == 0 || !bytes.Contains([]byte(out), []byte("--debug-addr no-such-host.invalid:x")) {
		t.Fatalf("agent with a bad --debug-addr exited %d: %s", code, out)
	}
}
