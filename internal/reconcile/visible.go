package reconcile

import (
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ipledger/ipledger/internal/ledger"
)

// witnesses are the leases of READY sandboxes, by the directory of their recorded
// namespace path: what can show a namespace directory visible to the agent.
type witnesses struct {
	byDir    map[string][]ledger.Lease
	resolved map[ledger.Key]bool // stat results, once per lease
	// mounts, when set, tells whether the agent sees the runtime's mounts
	// (Options.Mounts); asked at most once.
	mounts      func() (bool, string)
	mountsAsked bool
	mountsWhy   string
}

// newWitnesses keeps, of leases, those whose sandbox ready says is READY and whose
// namespace identity was recorded.
func newWitnesses(leases []ledger.Lease, ready func(ledger.Lease) bool) *witnesses {
	w := &witnesses{byDir: map[string][]ledger.Lease{}, resolved: map[ledger.Key]bool{}}
	for _, ls := range leases {
		if ls.NetNS.Path != "" && ls.NetNS.Ino != 0 && ready(ls) {
			d := filepath.Dir(ls.NetNS.Path)
			w.byDir[d] = append(w.byDir[d], ls)
		}
	}
	return w
}

// Resolves reports whether ns's path stats, as the agent sees it, to the nsfs
// identity recorded at ADD: the canary of a namespace directory's visibility. A
// READY sandbox's namespace that does not resolve means the agent does not see
// the runtime's mounts there (doctor warns of it); one that does shows the
// directory visible (see witnesses.visible).
func Resolves(ns ledger.NetNS) bool {
	var st unix.Stat_t
	return ns.Path != "" && ns.Ino != 0 && unix.Stat(ns.Path, &st) == nil && st.Dev == ns.Dev && st.Ino == ns.Ino
}

// allocatedNotBefore reports whether m was allocated at or after ls: by their boot
// clock readings when both are of one boot, else by their Created times.
func allocatedNotBefore(m, ls ledger.Lease) bool {
	if m.BootID != "" && m.BootID == ls.BootID && m.SinceBoot > 0 && ls.SinceBoot > 0 {
		return m.SinceBoot >= ls.SinceBoot
	}
	return !m.Created.Before(ls.Created)
}

// visible returns how the directory of ls's recorded namespace path is shown
// visible to the agent, or "" when it is not: a READY sandbox's lease, allocated at
// or after ls, whose path in that directory stats to the nsfs identity recorded at
// its ADD. A mount that the agent sees although it was made after ls's means the
// agent would see ls's namespace mounted there too: a container given the
// directory without mount propagation sees the mounts made before it started, not
// the ones made since, so an older witness proves nothing about a newer lease.
func (w *witnesses) visible(ls ledger.Lease) string {
	if w == nil {
		return ""
	}
	if w.mounts != nil && !w.mountsAsked {
		w.mountsAsked = true
		if ok, why := w.mounts(); ok {
			w.mountsWhy = why
		}
	}
	if w.mountsWhy != "" {
		return w.mountsWhy
	}
	for _, m := range w.byDir[filepath.Dir(ls.NetNS.Path)] {
		if m.Key == ls.Key || !allocatedNotBefore(m, ls) {
			continue
		}
		ok, done := w.resolved[m.Key]
		if !done {
			ok = Resolves(m.NetNS)
			w.resolved[m.Key] = ok
		}
		if ok {
			return fmt.Sprintf("the directory is visible to the agent: READY sandbox %.12s's namespace %s, made since, is its %d:%d", m.Key.ContainerID, m.NetNS.Path, m.NetNS.Dev, m.NetNS.Ino)
		}
	}
	return ""
}

// probe is the namespace verdict for ls. The runtime's or the agent's failure to
// see a namespace is not its absence: a namespace is gone only on positive
// evidence (DESIGN invariant 4):
//
//   - the lease was allocated on another boot (its BootID is not the one b
//     reads): every namespace of that boot ended with it, whatever is at the path
//     now (nsfs inode numbers repeat across boots), so nothing is probed;
//   - the probe found another namespace at the path (the same nsfs device, another
//     inode), or a /proc/PID path whose process is gone while the agent sees the
//     host's PID namespace (NSFS decides both);
//   - the probe could not see it (NSNotVisible: the path or its directory missing,
//     or a plain file on another filesystem where the namespace was mounted) and
//     the agent is in the runtime's mount namespace (Options.Mounts), or w shows
//     the directory visible (see witnesses.visible).
//
// Anything else NSNotVisible stays so: kept and reported.
func (r *Reconciler) probe(ls ledger.Lease, b bootReading, w *witnesses) (NSState, string) {
	if b.ok && ls.BootID != "" && ls.BootID != b.id {
		return NSGone, fmt.Sprintf("the lease was made on boot %s; this is boot %s: its namespace ended with that boot", ls.BootID, b.id)
	}
	st, info := r.o.Netns.Probe(ls.NetNS, ls.IPs)
	if st == NSNotVisible {
		if why := w.visible(ls); why != "" {
			seen, _, _ := strings.Cut(info, "; "+mountHintPrefix) // no mount to fix
			return NSGone, seen + "; " + why
		}
	}
	return st, info
}
