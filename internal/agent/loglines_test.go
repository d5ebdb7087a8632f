package agent_test

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/ledgerview"
	"github.com/ipledger/ipledger/internal/spool"
	"github.com/ipledger/ipledger/internal/testenv"
)

// TestServedRequestsLogTheirChanges: ADDs and DELs answered over a real socket (the
// agent answers first and logs after) still write one info line per change with the
// fields operators read: the attachment, its addresses, the pod UID of an allocation,
// the reason and detail of a release, a spooled DEL applied by an ADD included. Every
// line is written by the time Serve has drained (the lines of successive requests in
// any order: each is written after its answer).
func TestServedRequestsLogTheirChanges(t *testing.T) {
	var out testenv.Buffer
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	s := serveLedger(t, ledger.Options{Logger: log}, func(c *agent.Config) { c.Logger = log })
	call := func(req api.Request) *api.Response {
		t.Helper()
		resp, err := s.call(t, req)
		if err != nil {
			t.Fatalf("%s %s: %v", req.Op, req.ContainerID, err)
		}
		return resp
	}

	add := addReq(t, "c1")
	add.Pod = api.Pod{Namespace: "ns", Name: "web", UID: "uid-1"}
	first := call(add)
	del := api.Request{Version: api.Version, Op: api.OpDel, Network: "net", ContainerID: "c1", IfName: "eth0", Detail: "by test"}
	if r := call(del); r.Released != 1 {
		t.Fatalf("DEL released %d, want 1", r.Released)
	}
	second := call(add)
	if err := spool.Write(s.spool, spool.Entry{Key: ledgerview.Key(ledgertest.Key("c1")), Spooled: time.Now(), CNIVerb: "DEL"}); err != nil {
		t.Fatal(err)
	}
	third := call(add) // applies the spooled DEL of c1 first, then allocates
	s.stop(t)

	ips := func(r *api.Response) string { return "[" + strings.Join(r.Lease.IPs, " ") + "]" }
	want := []string{
		fmt.Sprintf("level=INFO msg=allocated attachment=net/c1/eth0 ips=%s podUID=uid-1", ips(first)),
		fmt.Sprintf("level=INFO msg=released attachment=net/c1/eth0 ips=%s reason=DEL detail=\"by test\"", ips(first)),
		fmt.Sprintf("level=INFO msg=allocated attachment=net/c1/eth0 ips=%s podUID=uid-1", ips(second)),
		fmt.Sprintf("level=INFO msg=released attachment=net/c1/eth0 ips=%s reason=DEL detail=\"spooled DEL (plugin clock ", ips(second)),
		fmt.Sprintf("level=INFO msg=allocated attachment=net/c1/eth0 ips=%s podUID=uid-1", ips(third)),
	}
	var got []string
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.Contains(line, "msg=allocated") || strings.Contains(line, "msg=released") {
			got = append(got, line)
		}
	}
	t.Logf("log:\n%s", out.String())
	if len(got) != len(want) {
		t.Fatalf("%d change lines, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	// each request's lines are written after its answer, so two requests in a row may
	// write theirs in either order: every wanted line once, in any order
	for _, w := range want {
		i := slices.IndexFunc(got, func(line string) bool { return strings.HasPrefix(line, w) })
		if i < 0 {
			t.Errorf("no line starting with %q", w)
			continue
		}
		got = slices.Delete(got, i, i+1)
	}
}
