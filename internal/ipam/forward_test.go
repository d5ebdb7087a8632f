package ipam_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ipam"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// TestForwardedMatchesLocal: an ADD or DEL handed to the agent whole (ipam.Forward,
// as ipledger-veth hands over an ipledger IPAM call: op "cni", the agent runs this
// package's verbs) gives exactly what the ipledger plugin prints and its exit status
// when it is exec'd for the same call: for results in every CNI version, errors of
// every kind (the bad inputs of TestBadInput) and a DEL's warnings. The relay shows
// that each hand-over is one request "cni", and the plugin's own call its own request.
func TestForwardedMatchesLocal(t *testing.T) {
	e := newEnv(t, agentenv.Options{})
	nsPath := netenv.Namespace(t, "ipl").Path
	relay := e.a.StartRelay(t, agentenv.Pass)
	via := func(c call) call {
		c.Stdin = strings.Replace(c.Stdin, strconv.Quote(e.a.Socket), strconv.Quote(relay.Socket), 1)
		return c
	}
	// local execs the plugin for c, which runs the verb itself.
	local := func(t *testing.T, c call, wantOwn string) outcome {
		t.Helper()
		o := execRaw(t, via(c))
		if ops := relay.Take(); len(ops) > 1 || (len(ops) == 1 && ops[0] != wantOwn) {
			t.Errorf("the plugin sent %q, want at most its own %q", ops, wantOwn)
		}
		return o
	}
	// forwarded hands c to the agent as a main plugin does; it reports whether the
	// agent ran it (false: the caller would exec the plugin).
	forwarded := func(t *testing.T, c call) (outcome, bool) {
		t.Helper()
		c = via(c)
		if c.IfName == "" {
			c.IfName = "eth0"
		}
		cc := api.CNICall{Command: c.Cmd, ContainerID: c.ContainerID, NetNS: c.Netns, IfName: c.IfName, Args: c.Args,
			Path: agentenv.Bin(t), Stdin: []byte(c.Stdin)}
		for _, u := range c.Unset {
			switch u {
			case "CNI_CONTAINERID":
				cc.ContainerID = ""
			case "CNI_IFNAME":
				cc.IfName = ""
			}
		}
		ans, ok := ipam.Forward(ctx(t), api.Call, ipam.NetNSID, cc)
		ops := relay.Take()
		if ok != slices.Equal(ops, []string{api.OpCNI}) || (!ok && len(ops) > 0) {
			t.Errorf("hand-over (taken: %v) sent %q, want one %q or none", ok, ops, api.OpCNI)
		}
		if !ok {
			return outcome{}, false
		}
		return outcome{stdout: ans.Stdout, stderr: ans.Stderr, exit: ans.Exit}, true
	}
	same := func(t *testing.T, what string, f, l outcome) {
		t.Helper()
		if !bytes.Equal(f.stdout, l.stdout) || !bytes.Equal(f.stderr, l.stderr) || f.exit != l.exit {
			t.Errorf("%s: forwarded and local differ:\nforwarded exit %d stdout %q stderr %q\nlocal     exit %d stdout %q stderr %q",
				what, f.exit, f.stdout, f.stderr, l.exit, l.stdout, l.stderr)
		}
	}

	const ranges = `[[{"subnet":"10.83.0.0/24"}],[{"subnet":"fd83::/120"}]]`
	for i, version := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run("result "+version, func(t *testing.T) {
			conf := e.pluginConf(version, "fwdnet", ranges)
			conf = strings.Replace(conf, `"ranges":`, `"routes":[{"dst":"0.0.0.0/0"},{"dst":"fd00::/8","gw":"fd83::1"}],"ranges":`, 1)
			conf = strings.Replace(conf, `"type":"ipledger",`, `"type":"ipledger","dns":{"nameservers":["10.83.0.10"],"search":["svc.local"]},`, 1)
			add := call{Cmd: "ADD", ContainerID: fmt.Sprint("fwd", i), Netns: nsPath, Stdin: conf,
				Args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-" + version + ";K8S_POD_UID=uid-" + version}
			f, ok := forwarded(t, add)
			if !ok || f.exit != 0 {
				t.Fatalf("ADD forwarded %v, exit %d: %s %s", ok, f.exit, f.stdout, f.stderr)
			}
			same(t, "ADD", f, local(t, add, api.OpAdd)) // the same lease again: ADD is idempotent
			del := add
			del.Cmd = "DEL"
			f, ok = forwarded(t, del)
			if !ok || f.exit != 0 {
				t.Fatalf("DEL forwarded %v, exit %d: %s %s", ok, f.exit, f.stdout, f.stderr)
			}
			same(t, "DEL", f, local(t, del, api.OpDel)) // unknown by now: success too
		})
	}
	t.Run("configuration too large to forward", func(t *testing.T) {
		big := strings.Replace(e.pluginConf("1.0.0", "fwdnet", ranges), `"type":"ipledger",`, `"type":"ipledger","runtimeConfig":{"x":"`+strings.Repeat("x", api.MaxRequest/2)+`"},`, 1)
		add := call{Cmd: "ADD", ContainerID: "fwdbig", Netns: nsPath, Stdin: big}
		if _, ok := forwarded(t, add); ok {
			t.Fatalf("a %d-byte configuration was handed over", len(big))
		}
		if o := local(t, add, api.OpAdd); o.exit != 0 {
			t.Fatalf("ADD of a %d-byte configuration by the plugin: exit %d: %s", len(big), o.exit, o.stdout)
		}
		del := add
		del.Cmd = "DEL"
		if o := local(t, del, api.OpDel); o.exit != 0 {
			t.Fatalf("DEL of a large configuration: exit %d: %s", o.exit, o.stdout)
		}
	})
	t.Run("DEL with warnings", func(t *testing.T) {
		conf := strings.Replace(e.pluginConf("1.0.0", "fwdnet", `"banana"`), `"ranges":`, `"timeout":"soon","ranges":`, 1)
		del := call{Cmd: "DEL", ContainerID: "fwdwarn", Stdin: conf}
		f, ok := forwarded(t, del)
		if !ok || f.exit != 0 || len(f.stderr) == 0 {
			t.Fatalf("DEL forwarded %v, exit %d, want success with a warning on stderr: %s %s", ok, f.exit, f.stdout, f.stderr)
		}
		same(t, "DEL", f, local(t, del, api.OpDel))
	})

	// TestBadInput's network and pool, in this test's agent
	const good = `[[{"subnet":"10.81.0.0/24"}]]`
	conf := func(ranges string) string { return e.pluginConf("1.0.0", "badnet", ranges) }
	if o := execRaw(t, call{Cmd: "ADD", ContainerID: "keeper", Netns: nsPath, Stdin: conf(good)}); o.exit != 0 {
		t.Fatalf("ADD: %s", o.stdout)
	}
	// the two inputs outside the shape Forward hands over: the caller execs the plugin
	notForwarded := []string{"malformed JSON", "missing ranges"}
	for i, tc := range badInputs(conf, good) {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c.add(i, nsPath)
			f, ok := forwarded(t, c)
			if ok == slices.Contains(notForwarded, tc.name) {
				t.Errorf("handed over: %v", ok)
			}
			if !ok {
				return
			}
			if f.exit == 0 {
				t.Fatalf("ADD succeeded: %s", f.stdout)
			}
			same(t, "ADD", f, local(t, c, api.OpAdd))
		})
	}
}

// TestForwardAnswersWhenTheAgentHangs: an agent that took a handed-over call and gives
// no answer within ipam.timeout (a relay that reads requests and never answers). The
// call is not left to the plugin, whose exec would wait as long again: Forward answers
// it with exactly what the plugin exec'd against the same agent prints after its own
// wait (an ADD fails with try-again-later; a DEL is spooled where the agent reads and
// succeeds), from the one request it sent. The agent then applies the spooled DEL.
func TestForwardAnswersWhenTheAgentHangs(t *testing.T) {
	e := newEnv(t, agentenv.Options{})
	nsPath := netenv.Namespace(t, "ipl").Path
	mute := e.a.StartRelay(t, agentenv.Mute)
	conf := e.pluginConf("1.0.0", "hungnet", `[[{"subnet":"10.84.0.0/24"}]]`)
	if o := execRaw(t, call{Cmd: "ADD", ContainerID: "held", Netns: nsPath, Stdin: conf}); o.exit != 0 {
		t.Fatalf("ADD: %s", o.stdout)
	}
	conf = strings.Replace(conf, strconv.Quote(e.a.Socket), strconv.Quote(mute.Socket), 1)
	conf = strings.Replace(conf, `"ranges":`, `"timeout":"300ms","ranges":`, 1)
	for _, c := range []call{
		{Cmd: "ADD", ContainerID: "waiting", Netns: nsPath, Stdin: conf},
		{Cmd: "DEL", ContainerID: "held", Stdin: conf},
	} {
		t.Run(c.Cmd, func(t *testing.T) {
			ans, ok := ipam.Forward(ctx(t), api.Call, ipam.NetNSID, api.CNICall{Command: c.Cmd, ContainerID: c.ContainerID,
				NetNS: c.Netns, IfName: "eth0", Path: agentenv.Bin(t), Stdin: []byte(c.Stdin)})
			if ops := mute.Take(); !slices.Equal(ops, []string{api.OpCNI}) {
				t.Errorf("the hand-over sent %q, want one %q", ops, api.OpCNI)
			}
			if !ok {
				t.Fatal("the call was left to the plugin, which waits for the hung agent once more")
			}
			o := execRaw(t, c)
			if ops := mute.Take(); len(ops) != 1 {
				t.Errorf("the plugin sent %q, want its one request", ops)
			}
			if !bytes.Equal(ans.Stdout, o.stdout) || !bytes.Equal(ans.Stderr, o.stderr) || ans.Exit != o.exit {
				t.Errorf("forwarded and exec'd differ:\nforwarded exit %d stdout %q stderr %q\nexec'd    exit %d stdout %q stderr %q",
					ans.Exit, ans.Stdout, ans.Stderr, o.exit, o.stdout, o.stderr)
			}
			switch c.Cmd {
			case "ADD":
				if ans.Exit == 0 || !bytes.Contains(ans.Stdout, []byte(`"code": 11`)) {
					t.Errorf("ADD against a hung agent: exit %d %s, want CNI error 11 (try again later)", ans.Exit, ans.Stdout)
				}
			case "DEL":
				if ans.Exit != 0 || !bytes.Contains(ans.Stderr, []byte("spooled in "+e.a.SpoolDir)) {
					t.Errorf("DEL against a hung agent: exit %d %s %s, want success, spooled in %s", ans.Exit, ans.Stdout, ans.Stderr, e.a.SpoolDir)
				}
			}
		})
	}
	for deadline := time.Now().Add(30 * time.Second); ipsOf(e.a.Leases(t), "hungnet", "held") != nil; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the agent did not apply the spooled DEL: held still holds its lease")
		}
	}
}

// TestForwardTimeoutFromTheError: the deadline that ends a hand-over is read from the
// call's error as well as from ctx, whose timer may not have fired yet when the socket's
// deadline has (a busy node; the fresh clone's CI saw Forward leave a timed-out call to
// the plugin, which waits as long again). A fake call answers at once with each error,
// so ctx has not ended: only the error tells a timeout from an agent that closed the
// connection, which is still left to the plugin. TestForwardAnswersWhenTheAgentHangs
// is the same over a real agent.
func TestForwardTimeoutFromTheError(t *testing.T) {
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"n","type":"ipledger","ipam":{"type":"ipledger","socket":%q,"timeout":"1h","ranges":[[{"subnet":"10.85.0.0/24"}]]}}`,
		filepath.Join(t.TempDir(), "s.sock"))
	for _, tc := range []struct {
		name     string
		err      error
		answered bool
	}{
		{"read deadline", fmt.Errorf("%w: reading the answer: %w", api.ErrNoAnswer, os.ErrDeadlineExceeded), true},
		{"write deadline", fmt.Errorf("%w: write: %w", api.ErrUnreachable, os.ErrDeadlineExceeded), true},
		{"closed without an answer", fmt.Errorf("%w: reading the answer: %w", api.ErrNoAnswer, io.EOF), false},
		{"unreachable", fmt.Errorf("%w: connect: %w", api.ErrUnreachable, syscall.ECONNREFUSED), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			fake := func(ctx context.Context, _ string, _ api.Request) (*api.Response, error) {
				calls++
				if ctx.Err() != nil {
					t.Fatal("ctx ended before the fake call returned")
				}
				return nil, tc.err
			}
			ans, ok := ipam.Forward(ctx(t), fake, func(string) api.NetNS { return api.NetNS{} }, api.CNICall{Command: "ADD",
				ContainerID: "c1", NetNS: "/proc/self/ns/net", IfName: "eth0", Path: "/opt/cni/bin", Stdin: []byte(conf)})
			if calls != 1 {
				t.Errorf("%d calls, want 1", calls)
			}
			if ok != tc.answered {
				t.Fatalf("answered %v, want %v", ok, tc.answered)
			}
			if ok && (ans.Exit == 0 || !bytes.Contains(ans.Stdout, []byte(`"code": 11`))) {
				t.Errorf("exit %d %s %s, want CNI error 11 (try again later)", ans.Exit, ans.Stdout, ans.Stderr)
			}
		})
	}
}
