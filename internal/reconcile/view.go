package reconcile

import (
	"sort"

	"github.com/ipledger/ipledger/internal/ledger"
)

// View is the last round's view of one lease, for operators.
type View struct {
	// Sandbox is the sandbox verdict (SandboxReady …); SandboxUnknown for a lease the
	// last round did not judge, "" before any listing has succeeded.
	Sandbox string
	// Suspect says why the lease is suspected, for how long and on how many
	// observations; "" when it is not.
	Suspect string
	Class   Class
}

// Suspected is one suspected lease that is still held, with the last round's view
// of it.
type Suspected struct {
	Lease ledger.Lease
	View  View
}

// Summary is the last round's counts, for an audit. Leaked counts leases found
// abandoned and awaiting release; Stranded those whose address is still configured
// in a NOTREADY or gone sandbox's namespace; Suspect every suspected lease. Only
// leases still held count.
type Summary struct {
	// RuntimeOK reports whether the last listing succeeded.
	RuntimeOK                 bool
	Suspect, Stranded, Leaked int
	// Suspects are the suspected leases in key order.
	Suspects []Suspected
}

// Verdict returns the last round's view of lease k. It never calls the runtime.
func (r *Reconciler) Verdict(k ledger.Key) View {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.views[k]; ok {
		return w
	}
	if r.listed {
		return View{Sandbox: SandboxUnknown}
	}
	return View{}
}

// Summary returns the counts of the last round. It never calls the runtime.
func (r *Reconciler) Summary() Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	sum := Summary{RuntimeOK: r.runtimeOK}
	keys := make([]ledger.Key, 0, len(r.views))
	for k, w := range r.views {
		if w.Class != ClassNone {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	for _, k := range keys {
		w := r.views[k]
		ls, ok := r.o.Ledger.Lease(k)
		if !ok {
			continue // released since the round
		}
		sum.Suspect++
		switch w.Class {
		case ClassStranded:
			sum.Stranded++
		case ClassAbandoned:
			sum.Leaked++
		}
		sum.Suspects = append(sum.Suspects, Suspected{Lease: ls, View: w})
	}
	return sum
}
