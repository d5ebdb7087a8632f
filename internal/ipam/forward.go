package ipam

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"slices"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cniplugin"
	"github.com/ipledger/ipledger/internal/jsonlite"
	"github.com/ipledger/ipledger/internal/ledger"
)

// Why the plugin hands ADD and DEL to the agent whole: the plugin is a new process
// per call, and everything it runs is run cold: checking the CNI_* variables and the
// configuration, parsing the ranges and CNI_ARGS, encoding the result cost about 0.25
// ms of every ADD in a cold process (docs/call-breakdown.md), a fifth of that in the
// agent, which runs the same code all day. So the plugin sends the call as the runtime
// made it (the CNI_* variables, stdin, and the identities of CNI_NETNS and of its own
// namespace, which the agent may not be able to see) in one request, and the agent
// runs this package's verbs on it through cniplugin.Main, exactly as the plugin would,
// against its ledger without a socket in between; the plugin prints what the agent
// answers and exits with its status. The other verbs, and every call the agent does not
// answer with a CNI outcome (unreachable, killed, draining, an older agent), run here
// as before, so a DEL is still spooled by the plugin when the agent is away.

// about is printed when the binary is run by hand.
const about = "ipledger: IPAM plugin, a client of ipledgerd"

// Main is the plugin process: it returns the exit status.
func (p *Plugin) Main(env cniplugin.Env) int {
	if cmd := env.Getenv("CNI_COMMAND"); cmd == "ADD" || cmd == "DEL" {
		stdin, err := io.ReadAll(env.Stdin)
		env.Stdin = bytes.NewReader(stdin)
		if err != nil {
			// cniplugin.Main reports it
			env.Stdin = io.MultiReader(env.Stdin, errReader{err})
		} else if code, ok := p.forward(env, cmd, stdin); ok {
			return code
		}
	}
	return cniplugin.Main(env, p.Funcs(), Versions, about)
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// forward hands the call to the agent; ok is false when the agent did not run it.
func (p *Plugin) forward(env cniplugin.Env, cmd string, stdin []byte) (exit int, ok bool) {
	ans, ok := Forward(context.Background(), p.Call, p.netns, api.CNICall{Command: cmd,
		ContainerID: env.Getenv("CNI_CONTAINERID"), NetNS: env.Getenv("CNI_NETNS"), IfName: env.Getenv("CNI_IFNAME"),
		Args: env.Getenv("CNI_ARGS"), Path: env.Getenv("CNI_PATH"), NetNSOverride: env.Getenv("CNI_NETNS_OVERRIDE"), Stdin: stdin})
	if !ok {
		return 0, false
	}
	env.Stderr.Write(ans.Stderr)
	if _, err := env.Stdout.Write(ans.Stdout); err != nil {
		return 1, true
	}
	return ans.Exit, true
}

// maxForwardedStdin bounds the encoded stdin of a forwarded call well inside the
// agent's request limit; a larger configuration (a huge prevResult or runtimeConfig) is
// run by the plugin, whose own request carries only what it needs.
const maxForwardedStdin = api.MaxRequest / 2

// Forward hands one ADD or DEL of this plugin, as the runtime (or a main plugin
// delegating to it) made it, to the agent its configuration names, through call; for
// an ADD it first reads the identities of CNI_NETNS and of the caller's own namespace
// with netns. ok is false when the agent did not run it (unreachable, no answer,
// unavailable, a configuration outside the common shape, an agent of an older
// release): the caller then runs the plugin itself.
func Forward(ctx context.Context, call func(context.Context, string, api.Request) (*api.Response, error), netns func(string) ledger.NetNS, c api.CNICall) (*api.CNIAnswer, bool) {
	if c.Command != "ADD" && c.Command != "DEL" || base64.StdEncoding.EncodedLen(len(c.Stdin)) > maxForwardedStdin {
		return nil, false
	}
	socket, timeout, ok := agentOf(c.Stdin)
	if !ok {
		return nil, false
	}
	if c.Command == "ADD" {
		c.NetNSID, c.SelfNetNS = netns(c.NetNS), netns(selfNetNS)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := call(ctx, socket, api.Request{Op: api.OpCNI, CNI: &c})
	if err != nil || resp.CNI == nil {
		return nil, false
	}
	return resp.CNI, true
}

// skipField skips the value of key, one of known or a key encoding/json would not
// take for one of them; false for a key it would take for another (a different case).
func skipField(d *jsonlite.Decoder, key string, known []string) bool {
	if !slices.Contains(known, key) && !jsonlite.Skippable(key, known...) {
		return false
	}
	_, ok := d.Skip()
	return ok
}

// agentOf reads ipam.socket and ipam.timeout from a configuration in the common shape
// (jsonlite's subset, keys spelled as in Config), with their defaults; a timeout that
// is not a duration is left to the agent to report (ADD fails on it, DEL warns). ok is
// false for a configuration outside the shape: the plugin's own parse reports what is
// wrong with it.
func agentOf(stdin []byte) (socket string, timeout time.Duration, ok bool) {
	var t string
	d := jsonlite.NewDecoder(stdin)
	ok = d.Object(func(k string) bool {
		if k == "ipam" {
			return d.Object(func(k string) bool {
				switch k {
				case "socket":
					return d.SetStr(&socket)
				case "timeout":
					return d.SetStr(&t)
				}
				return skipField(d, k, ipamFields)
			})
		}
		return skipField(d, k, netConfFields)
	}) && d.End()
	if !ok {
		return "", 0, false
	}
	if socket == "" {
		socket = DefaultSocket
	}
	timeout = DefaultTimeout
	if v, err := time.ParseDuration(t); err == nil && v > 0 {
		timeout = v
	}
	return socket, timeout, true
}
