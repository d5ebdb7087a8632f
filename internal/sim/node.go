package sim

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/reconcile"
)

// runtime is the modelled container runtime as the reconciler sees it.
type runtime struct{ w *world }

var _ reconcile.Runtime = runtime{}

// reloading reports whether the runtime has not yet reloaded sb: it is neither listed
// nor found (a runtime that forgot its state while it restarts).
func (w *world) reloading(sb *sandbox) bool {
	return w.now() < w.reloadUntil && sb.pid%2 == 1
}

func (r runtime) ListSandboxes(context.Context) ([]cri.Sandbox, error) {
	w := r.w
	if !w.runtimeUp() {
		return nil, errRuntimeDown
	}
	out := make([]cri.Sandbox, 0, len(w.listed))
	for _, sb := range w.listed {
		if w.reloading(sb) {
			continue
		}
		out = append(out, criOf(sb))
	}
	return out, nil
}

func (r runtime) SandboxStatus(_ context.Context, id string) (cri.Sandbox, error) {
	w := r.w
	if !w.runtimeUp() {
		return cri.Sandbox{}, errRuntimeDown
	}
	sb := w.sandboxes[id]
	if sb == nil || sb.state == sbRemoved || w.reloading(sb) {
		return cri.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, cri.ErrNotFound)
	}
	if sb.state == sbCreating {
		return cri.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, cri.ErrNotFound)
	}
	return criOf(sb), nil
}

func criOf(sb *sandbox) cri.Sandbox {
	st := cri.StateNotReady
	if sb.state == sbReady {
		st = cri.StateReady
	}
	return cri.Sandbox{ID: sb.id, State: st, Namespace: podNamespace, Name: sb.pod.name, UID: sb.pod.uid, Attempt: uint32(sb.attempt)}
}

// namespaces is the modelled network namespaces as the reconciler probes them: a
// namespace is known by the path recorded at ADD (unique per sandbox here).
type namespaces struct{ w *world }

var _ reconcile.Netns = namespaces{}

func (n namespaces) Probe(ns ledger.NetNS, ips []netip.Prefix) (reconcile.NSState, string) {
	if ns.Path == "" {
		return reconcile.NSNotRecorded, ""
	}
	sb := n.w.byNetns(ns.Path)
	if sb == nil || !sb.nsAlive {
		return reconcile.NSGone, ns.Path + " does not exist"
	}
	for _, p := range ips {
		if n.w.users[p.Addr()] == sb {
			return reconcile.NSAddrPresent, p.Addr().String() + " configured"
		}
	}
	return reconcile.NSAddrAbsent, ""
}

func (n namespaces) Reclaim(ledger.NetNS, string, []netip.Prefix) (string, error) {
	return "", errors.New("sim: stranded reclaim is not modelled")
}

func (w *world) byNetns(path string) *sandbox {
	prefix := w.tmp + "/netns/"
	if len(path) <= len(prefix) || path[:len(prefix)] != prefix {
		return nil
	}
	return w.sandboxes[path[len(prefix):]]
}
