package ipam_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ipledger/ipledger/internal/spool"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// TestDelLenient execs the plugin's DEL with configs broken in fields DEL does not
// use: each DEL succeeds and releases the attachment's lease, because the network
// name, CNI_CONTAINERID and CNI_IFNAME identify it. Configs that do not name the
// network or the agent fail with the field named.
func TestDelLenient(t *testing.T) {
	e := newEnv(t, agentenv.Options{})
	nsPath := netenv.Namespace(t, "ipl").Path
	const ranges = `[[{"subnet":"10.79.0.0/24"}]]`
	good := e.pluginConf("1.0.0", "lenient", ranges)
	sock := fmt.Sprintf("%q", e.a.Socket)
	for i, c := range []struct{ name, stdin string }{
		{"mtu of the wrong type", strings.Replace(good, `"type":"ipledger","ipam"`, `"type":"ipledger","mtu":"jumbo","ipam"`, 1)},
		{"bad timeout", strings.Replace(good, `"ranges":`, `"timeout":"soon","ranges":`, 1)},
		{"timeout of the wrong type", strings.Replace(good, `"ranges":`, `"timeout":5,"ranges":`, 1)},
		{"bad route", strings.Replace(good, `"ranges":`, `"routes":[{"dst":"nowhere"}],"ranges":`, 1)},
		{"routes of the wrong shape", strings.Replace(good, `"ranges":`, `"routes":{"dst":1},"ranges":`, 1)},
		{"malformed ranges", e.pluginConf("1.0.0", "lenient", `[[{"subnet":"10.79.0.0/33"}]]`)},
		{"ranges of the wrong shape", e.pluginConf("1.0.0", "lenient", `"10.79.0.0/24"`)},
		{"dns of the wrong type", strings.Replace(good, `"type":"ipledger","ipam"`, `"type":"ipledger","dns":"8.8.8.8","ipam"`, 1)},
		{"unknown fields", strings.Replace(good, `"ranges":`, `"futureKnob":{"x":[1,2]},"ranges":`, 1)},
		{"no ipam section", fmt.Sprintf(`{"cniVersion":"1.0.0","name":"lenient","type":"ipledger","ipam":{"type":"ipledger","socket":%s}}`, sock)},
	} {
		t.Run(c.name, func(t *testing.T) {
			cid := fmt.Sprintf("len%02d", i)
			if _, cerr := execPlugin(t, call{Cmd: "ADD", ContainerID: cid, Netns: nsPath, Stdin: good}); cerr != nil {
				t.Fatal(cerr)
			}
			if _, cerr := execPlugin(t, call{Cmd: "DEL", ContainerID: cid, Stdin: c.stdin}); cerr != nil {
				t.Fatalf("DEL with %s: %v", c.name, cerr)
			}
			if ips := ipsOf(e.a.Leases(t), "lenient", cid); ips != nil {
				t.Fatalf("DEL with %s answered success and %s still holds %v", c.name, cid, ips)
			}
		})
	}
	for _, c := range []struct {
		name, stdin string
		code        uint
		words       []string
	}{
		{"not JSON", `{"cniVersion":"1.0.0",`, types.ErrDecodingFailure, []string{"JSON"}},
		{"no name", strings.Replace(good, `"name":"lenient",`, ``, 1), types.ErrInvalidNetworkConfig, []string{"name"}},
		{"name not a string", strings.Replace(good, `"name":"lenient"`, `"name":7`, 1), types.ErrDecodingFailure, []string{"name"}}, // the dispatcher refuses it first
		{"socket not a string", strings.Replace(good, `"socket":`+sock, `"socket":1`, 1), types.ErrInvalidNetworkConfig, []string{"ipam.socket"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, cerr := execPlugin(t, call{Cmd: "DEL", ContainerID: "whoever", Stdin: c.stdin})
			wantCode(t, cerr, c.code, c.words...)
		})
	}
}

// TestDelSpoolsWhereTheAgentReads: an agent with its state somewhere other than the
// default and a network config naming only the socket. While the agent is down, a DEL
// through the real plugin is spooled where that agent reads (the spool it published
// next to the socket), and the restarted agent applies it. Without a published spool,
// DEL fails with a CNI error naming the socket, and the runtime retries it.
func TestDelSpoolsWhereTheAgentReads(t *testing.T) {
	elsewhere, err := os.MkdirTemp("/tmp", "ipl-elsewhere-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(elsewhere) })
	// no --spool-dir: the agent keeps its spool in its state dir, as deployed
	a := agentenv.Start(t, agentenv.Options{Args: []string{"--state-dir", elsewhere, "--spool-dir", ""}})
	a.StateDir, a.SpoolDir = elsewhere, filepath.Join(elsewhere, "spool")
	nsPath := netenv.Namespace(t, "ipl").Path
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"far","type":"ipledger","ipam":{"type":"ipledger","socket":%q,"ranges":[[{"subnet":"10.78.0.0/24"}]]}}`, a.Socket)
	for _, cid := range []string{"spooled", "refused"} {
		if _, cerr := execPlugin(t, call{Cmd: "ADD", ContainerID: cid, Netns: nsPath, Stdin: conf}); cerr != nil {
			t.Fatal(cerr)
		}
	}
	const defaultSpool = "/var/lib/ipledger/spool"
	before := spool.Len(defaultSpool)
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}

	if _, cerr := execPlugin(t, call{Cmd: "DEL", ContainerID: "spooled", Stdin: conf}); cerr != nil {
		t.Fatalf("DEL with the agent down: %v", cerr)
	}
	if n := spool.Len(a.SpoolDir); n != 1 {
		t.Fatalf("the agent's spool %s holds %d entries after the DEL, want 1", a.SpoolDir, n)
	}
	if n := spool.Len(defaultSpool); n != before {
		t.Fatalf("the DEL went to %s (%d entries, %d before), where this agent never reads", defaultSpool, n, before)
	}

	// no pointer (a reboot emptied /run, and the agent has not started yet)
	if err := os.Remove(spool.Pointer(a.Socket)); err != nil {
		t.Fatal(err)
	}
	_, cerr := execPlugin(t, call{Cmd: "DEL", ContainerID: "refused", Stdin: conf})
	wantCode(t, cerr, types.ErrTryAgainLater, a.Socket)

	a.Restart()
	leases := a.Leases(t)
	if ips := ipsOf(leases, "far", "spooled"); ips != nil {
		t.Fatalf("the restarted agent did not apply the spooled DEL: spooled still holds %v", ips)
	}
	if ips := ipsOf(leases, "far", "refused"); ips == nil {
		t.Fatal("the DEL that failed released its lease anyway")
	}
	// the runtime retries the DEL that failed
	if _, cerr := execPlugin(t, call{Cmd: "DEL", ContainerID: "refused", Stdin: conf}); cerr != nil {
		t.Fatalf("retried DEL: %v", cerr)
	}
	if l := a.Leases(t); len(l) != 0 {
		t.Fatalf("leases left: %v", l)
	}
}
