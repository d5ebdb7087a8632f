package agent

import (
	"bytes"
	"context"
	"errors"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cniplugin"
	"github.com/ipledger/ipledger/internal/ipam"
	"github.com/ipledger/ipledger/internal/ledger"
)

// errLeaveToPlugin: the agent cannot serve a handed-over call now (CodeUnavailable);
// the caller execs the IPAM plugin, which spools a DEL if it must.
var errLeaveToPlugin = errors.New("leave the call to the plugin")

// cni runs one ipledger IPAM call that a main plugin handed over (api.OpCNI,
// ipam.Forward) instead of exec'ing the IPAM plugin, as that plugin would run it:
// internal/ipam's verbs under cniplugin.Main, with the call's environment and stdin,
// their requests handled here without a socket, and the identities of CNI_NETNS and of
// the caller's namespace as the caller read them. The call is counted in the metrics as
// verb "cni" (result ok: the agent ran it, whatever its CNI outcome; unavailable: it
// left it to the caller), and each inner request under its own verb, so add and del
// count every ADD and DEL the agent served either way.
func (s *Server) cni(ctx context.Context, req api.Request, later *ledger.LogLines) *api.Response {
	c := req.CNI
	if c == nil || (c.Command != "ADD" && c.Command != "DEL") {
		return errResp(&api.Error{Code: api.CodeInvalid, Msg: "cni: the agent runs ADD and DEL only"})
	}
	var stdout, stderr bytes.Buffer
	leave := false
	p := &ipam.Plugin{
		Stdout: &stdout,
		Stderr: &stderr,
		Now:    time.Now,
		NetNS: func(path string) ledger.NetNS {
			switch path {
			case c.NetNS:
				return c.NetNSID
			case ipam.SelfNetNS:
				return c.SelfNetNS
			}
			return ledger.NetNS{Path: path}
		},
		Call: func(ctx context.Context, _ string, r api.Request) (*api.Response, error) {
			if r.Op != api.OpAdd && r.Op != api.OpDel {
				return nil, errLeaveToPlugin
			}
			r.Version = api.Version
			start := time.Now()
			resp, counted := s.handle(ctx, r, later)
			if counted {
				s.stats.observe(opLabel(r.Op), time.Since(start), resp)
			}
			if e := resp.Error; e != nil {
				if e.Code == api.CodeUnavailable {
					leave = true
					return nil, errLeaveToPlugin
				}
				return resp, e
			}
			return resp, nil
		},
	}
	env := cniplugin.Env{Stdin: bytes.NewReader(c.Stdin), Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string {
		switch k {
		case "CNI_COMMAND":
			return c.Command
		case "CNI_CONTAINERID":
			return c.ContainerID
		case "CNI_NETNS":
			return c.NetNS
		case "CNI_IFNAME":
			return c.IfName
		case "CNI_ARGS":
			return c.Args
		case "CNI_PATH":
			return c.Path
		case "CNI_NETNS_OVERRIDE":
			return c.NetNSOverride
		}
		return ""
	}}
	exit := cniplugin.Main(env, p.Funcs(), ipam.Versions, "")
	if leave {
		return errResp(&api.Error{Code: api.CodeUnavailable, Msg: "cni: the agent cannot serve this call now; the plugin runs it"})
	}
	return &api.Response{CNI: &api.CNIAnswer{Exit: exit, Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}}
}
