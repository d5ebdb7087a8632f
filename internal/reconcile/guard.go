package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/ledger"
)

// sandboxOf asks the runtime about one sandbox: READY, NOTREADY, GONE or UNKNOWN,
// and the answer it is based on.
func (r *Reconciler) sandboxOf(ctx context.Context, id string) (string, string) {
	st, err := r.o.Runtime.SandboxStatus(ctx, id)
	switch {
	case errors.Is(err, cri.ErrNotFound):
		return SandboxGone, "status: not found"
	case err != nil:
		return SandboxUnknown, "status failed: " + err.Error()
	case st.State == cri.StateReady:
		return SandboxReady, "status READY"
	case st.State == cri.StateNotReady:
		return SandboxNotReady, "status NOTREADY"
	}
	return SandboxUnknown, "status " + st.State.String()
}

// guard judges one lease for supersession or GC: whether the runtime and the
// namespace recorded at ADD together show the holder cannot use its address, and the
// evidence. A lease younger than Grace (see Reconciler.ageLocked) whose sandbox the
// runtime does not know may be in creation (its ADD may not have returned yet): kept.
func (r *Reconciler) guard(ctx context.Context, who string, ls ledger.Lease) bool {
	age := r.age(ls)
	sb, status := r.sandboxOf(ctx, ls.Key.ContainerID)
	o := observation{ls: ls, sandbox: sb, status: status}
	d := decision{level: slog.LevelInfo, o: o, age: age}
	switch {
	case sb == SandboxGone && age < r.o.Grace:
		d.what = fmt.Sprintf("%s: keep: maybe in creation (%s old, grace %s)", who, age.Round(time.Millisecond), r.o.Grace)
	case sb != SandboxGone && sb != SandboxNotReady:
		d.what = who + ": keep: the runtime does not say the sandbox is gone or NOTREADY"
	default:
		d.o.ns, d.o.nsInfo = r.probe(ls, r.readBoot(), r.lastWitnesses())
		if abandoned(sb, d.o.ns) {
			d.what = who + ": may release"
			r.logDecision(ctx, d, r.o.Clock.Mono())
			return true
		}
		d.what = who + ": keep: the namespace does not show the address unused"
	}
	r.logDecision(ctx, d, r.o.Clock.Mono())
	return false
}

// Supersedable implements agent.Guard: of olds, the leases whose sandbox the
// runtime reports gone or NOTREADY and whose address the namespace recorded at ADD
// no longer holds. When the runtime cannot tell, none.
func (r *Reconciler) Supersedable(ctx context.Context, olds []ledger.Lease) []ledger.Key {
	var out []ledger.Key
	for _, ls := range olds {
		if r.guard(ctx, "supersede", ls) {
			out = append(out, ls.Key)
		}
	}
	return out
}

// MayRelease implements agent.Guard: GC may release ls only when the runtime
// reports its sandbox gone or NOTREADY and the address is not in use, the same
// evidence the reconciler needs (minus the grace and the two observations: GC comes
// from the runtime), and never while the lease may still be in creation.
func (r *Reconciler) MayRelease(ctx context.Context, ls ledger.Lease) bool {
	return r.guard(ctx, "gc", ls)
}

// lastWitnesses are the witnesses of the last round's READY sandboxes (a Guard
// question has no listing of its own; the stat of each witness's path is taken
// now).
func (r *Reconciler) lastWitnesses() *witnesses {
	leases := r.o.Ledger.Leases("")
	r.mu.Lock()
	defer r.mu.Unlock()
	w := newWitnesses(leases, func(ls ledger.Lease) bool { return r.views[ls.Key].Sandbox == SandboxReady })
	w.mounts = r.o.Mounts
	return w
}
