package ipam_test

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
)

// TestForwardedMatchesLocal: an ADD or DEL that the plugin hands to the agent whole
// (op "cni": the agent runs the plugin's verbs) prints exactly what the plugin prints
// when it runs the call itself, as it does when the agent is of an older release, and
// exits the same: for results in every CNI version, errors of every kind (the bad
// inputs of TestBadInput) and a DEL's warnings. The relays show which path each call
// took: one request "cni" when forwarded, "cni" refused and then the plugin's own
// request when not.
func TestForwardedMatchesLocal(t *testing.T) {
	e := newEnv(t, agentenv.Options{})
	_, nsPath := netns(t)
	fwd := e.a.StartRelay(t, false)
	old := e.a.StartRelay(t, true)
	via := func(r *agentenv.Relay, c call) call {
		c.Stdin = strings.Replace(c.Stdin, strconv.Quote(e.a.Socket), strconv.Quote(r.Socket), 1)
		return c
	}
	// local runs c through the old relay: the plugin runs the verb itself.
	local := func(t *testing.T, c call, wantOwn string) outcome {
		t.Helper()
		o := execRaw(t, via(old, c))
		ops := old.Take()
		own := ops
		if len(own) > 0 && own[0] == api.OpCNI {
			own = own[1:]
		}
		if len(own) > 1 || (len(own) == 1 && own[0] != wantOwn) {
			t.Errorf("through an old agent: requests %q, want %q refused, then at most the plugin's own %q", ops, api.OpCNI, wantOwn)
		}
		return o
	}
	// forwarded runs c with the agent behind the plain relay; it reports whether the
	// plugin forwarded it (one request "cni") rather than sending its own request (or
	// none, when it failed before it).
	forwarded := func(t *testing.T, c call) (outcome, bool) {
		t.Helper()
		o := execRaw(t, via(fwd, c))
		ops := fwd.Take()
		handed := slices.Equal(ops, []string{api.OpCNI})
		if !handed && len(ops) > 0 && !slices.Equal(ops, []string{api.OpAdd}) && !slices.Equal(ops, []string{api.OpDel}) {
			t.Errorf("the call sent %q, want one %q, or the plugin's own request", ops, api.OpCNI)
		}
		return o, handed
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
		f, ok := forwarded(t, add)
		if ok || f.exit != 0 {
			t.Fatalf("ADD of a %d-byte configuration: forwarded %v, exit %d: %s", len(big), ok, f.exit, f.stdout)
		}
		same(t, "ADD", f, local(t, add, api.OpAdd))
		del := add
		del.Cmd = "DEL"
		if o := execRaw(t, via(fwd, del)); o.exit != 0 || !slices.Equal(fwd.Take(), []string{api.OpDel}) {
			t.Fatalf("DEL of a large configuration not run by the plugin itself: exit %d: %s", o.exit, o.stdout)
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
	// the two inputs outside the shape the plugin forwards: it runs them itself
	notForwarded := []string{"malformed JSON", "missing ranges"}
	for i, tc := range badInputs(conf, good) {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c.add(i, nsPath)
			f, ok := forwarded(t, c)
			if ok == slices.Contains(notForwarded, tc.name) {
				t.Errorf("forwarded: %v", ok)
			}
			if f.exit == 0 {
				t.Fatalf("ADD succeeded: %s", f.stdout)
			}
			same(t, "ADD", f, local(t, c, api.OpAdd))
		})
	}
}
