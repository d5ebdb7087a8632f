package ipam

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"slices"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/jsonlite"
)

// Forward is the hand-over of an ipledger IPAM call to the agent, for ipledger-veth:
// instead of exec'ing this plugin for each pod's ADD and DEL (a process whose start
// alone costs about 1.5 ms here, the bench's floor), the main plugin sends the call as
// it would have made it (the CNI_* variables, stdin, and the identities of CNI_NETNS
// and of its own namespace, which the agent may not be able to see) in one request, and
// the agent runs this package's verbs on it through cniplugin.Main, exactly as this
// plugin would, against its ledger without a socket in between; it answers what the
// plugin would have printed and its exit status. Every call the agent does not answer
// with a CNI outcome (unreachable, killed, draining, an older agent) is left to the
// caller, which then execs the plugin (and the plugin spools a DEL when the agent is
// away). A call the agent took but did not answer within ipam.timeout is not left to
// the plugin, which would wait as long again: Forward answers it as the plugin would
// after its own wait (Run with the agent's error: an ADD fails with
// try-again-later, a DEL is spooled).
//
// The plugin itself does not hand its own calls over: it is a process already, so a
// hand-over would spare it only its configuration, CNI_ARGS and result work, and the
// scan of the socket, the larger request and the agent's share cost as much
// (docs/call-breakdown.md).

// maxForwardedStdin bounds the encoded stdin of a forwarded call well inside the
// agent's request limit; a larger configuration (a huge prevResult or runtimeConfig) is
// run by the plugin, whose own request carries only what it needs.
const maxForwardedStdin = api.MaxRequest / 2

// Forward hands one ADD or DEL of this plugin, as the runtime (or a main plugin
// delegating to it) made it, to the agent its configuration names, through call; for
// an ADD it first reads the identities of CNI_NETNS and of the caller's own namespace
// with netns. handled is false when the agent did not run it (unreachable, closed
// without an answer, unavailable, a configuration outside the common shape, an agent
// of an older release): ans is nil and the caller runs the plugin itself. When handled,
// ans is the call's outcome, what the plugin would have printed and its exit status,
// whether that is success or a CNI error; when ipam.timeout ran out it is the plugin's
// answer to that.
func Forward(ctx context.Context, call api.CallFunc, netns api.NetNSFunc, c api.CNICall) (ans *api.CNIAnswer, handled bool) {
	if c.Command != "ADD" && c.Command != "DEL" || base64.StdEncoding.EncodedLen(len(c.Stdin)) > maxForwardedStdin {
		return nil, false
	}
	socket, timeout, ok := agentOf(c.Stdin)
	if !ok {
		return nil, false
	}
	if c.Command == "ADD" {
		c.NetNSID, c.SelfNetNS = netns(c.NetNS), netns(SelfNetNS)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := call(ctx, socket, api.Request{Op: api.OpCNI, CNI: &c})
	if timedOut(ctx, err) && (errors.Is(err, api.ErrNoAnswer) || errors.Is(err, api.ErrUnreachable)) {
		// The agent has had the call's whole ipam.timeout. The plugin exec'd now would
		// wait for it as long again (twice the timeout before the runtime hears of it),
		// and then do what its own code does with this error here: fail an ADD with
		// try-again-later, spool a DEL.
		return Run(Plugin{Now: time.Now, Call: func(context.Context, string, api.Request) (*api.Response, error) {
			return nil, err
		}}, &c), true
	}
	if err != nil || resp.CNI == nil {
		return nil, false
	}
	return resp.CNI, true
}

// timedOut tells whether err ended a call because ctx's deadline passed. The socket's
// deadline fires apart from ctx's timer: on a busy node the read fails before ctx.Err()
// is set, so ctx.Err() alone would miss the very case it stands for, and the error's
// own cause is checked too.
func timedOut(ctx context.Context, err error) bool {
	return err != nil && (ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded))
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
