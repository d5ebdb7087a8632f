package agent

import (
	"context"
	"errors"
	"time"

	"github.com/ipledger/ipledger/internal/api"
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
	leave := false
	p := ipam.Plugin{
		Now: time.Now,
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
	ans := ipam.Run(p, c)
	if leave {
		return errResp(&api.Error{Code: api.CodeUnavailable, Msg: "cni: the agent cannot serve this call now; the plugin runs it"})
	}
	return &api.Response{CNI: ans}
}
