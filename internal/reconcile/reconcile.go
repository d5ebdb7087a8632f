// Package reconcile compares the ledger's leases with the container runtime's pod
// sandboxes and releases the leases whose holder can no longer use its address. It
// is also the agent's Guard: the runtime's say in supersession and GC.
//
// # Evidence
//
// A lease's key names its sandbox (CNI_CONTAINERID). Each round lists every sandbox
// and, for every lease, reaches one verdict:
//
//   - READY: the sandbox is listed (or its status says) READY. Never released
//     (invariant 2); any suspicion is dropped.
//   - GONE: the sandbox is not in the listing AND SandboxStatus answers NotFound for
//     it. A listing alone never proves absence.
//   - NOTREADY: the runtime reports the sandbox NOTREADY.
//   - UNKNOWN: anything else (an error or timeout of SandboxStatus, a state the
//     runtime does not name): no evidence, nothing changes for that lease.
//
// GONE and NOTREADY are then checked against the network namespace recorded at ADD
// (NetNS.Path with its Dev/Ino identity), see [Netns]:
//
//   - the namespace no longer exists at its path (or the path now holds another
//     namespace), or the namespace holds none of the lease's addresses: the holder
//     cannot use the address, the lease is "abandoned";
//   - the namespace still holds one of the lease's addresses: the lease is
//     "stranded" (e.g. a chained plugin failed ADD and DEL, and the interface stays
//     configured in the NOTREADY sandbox). A stranded lease is reported and kept,
//     so the address is never handed to another pod while it is configured there;
//   - no namespace was recorded: GONE is abandoned (the runtime's NotFound is the
//     evidence), NOTREADY is only suspected (nothing can verify it);
//   - the namespace cannot be inspected: no evidence;
//   - a path whose identity was not recorded at ADD is judged by what is at it
//     now (see [NSFS]), so such a lease is not kept UNKNOWN forever.
//
// An abandoned lease is released (reason reconcile-gone or reconcile-notready) when
// the suspicion has held for Grace since it was first seen AND was confirmed by at
// least two observations in trustworthy rounds. Any observation of the sandbox
// READY, or of the address in use, resets it.
//
// # Time
//
// Every "how long" (the grace, the stranded grace, the in-creation window) is
// measured on Clock.Mono, which wall-clock steps do not move. A lease's Created is
// a wall time possibly written by an earlier process; it identifies the holder but
// is never subtracted from. A lease's age is counted from this process's first
// sight of it (a round, or a Guard question): a lease made before a restart is
// first seen at the first round, so a restart can delay a release, never hurry it.
//
// # When in doubt, keep (invariant 4) — but only what the doubt touches
//
// A round whose listing fails does nothing at all, not even aging suspicions. A
// round is "doubtful" (releases nothing, and its observations do not count toward
// the two confirmations) when its listing contradicts recent history: it is empty
// while the previous successful listing was not, or a sandbox listed before is
// missing from it while SandboxStatus still finds it (a partial listing; such a
// sandbox stays in the history until it is listed again or found gone). A
// suspicion first seen in a doubtful round does start its clock, since each GONE
// is a per-sandbox NotFound.
//
// Errors confine doubt to what they touch: a failed SandboxStatus for sandbox X
// leaves only the leases of X without evidence (kept as they were, shown UNKNOWN);
// a sandbox never listed before that SandboxStatus finds (created between the
// listing and the status call, the normal case on a busy node) is judged on its
// status. Neither makes the round doubtful, so one broken sandbox or a steady
// stream of new pods cannot stop every release (invariant 3). After a real reboot
// the runtime may answer an empty list forever: the first empty round is doubtful,
// the next ones are consistent with the (empty) history, and each lease is released
// on its own per-sandbox NotFound confirmations, within Grace plus one Interval of
// the runtime answering.
//
// A lease first seen less than Grace ago whose sandbox the runtime does not know is
// assumed to be in creation (containerd adds a sandbox to its store only after CNI
// ADD): it is not shown as suspect and its observations do not count toward the
// two confirmations, but its clock starts at the first such observation.
//
// Every round logs one line per lease ("reconcile: decision") with the decision and
// its evidence: the sandbox verdict and where it came from (the listing,
// SandboxStatus or its error), the namespace probe, the observations that counted,
// how long it has been suspected and seen. READY and in-creation leases log at
// Debug, failures to get evidence at Warn, everything else at Info.
//
// # Stranded reclaim (off by default)
//
// With ReclaimStranded, a lease whose sandbox is listed NOTREADY and whose
// namespace still holds the address for StrandedGrace (and two trustworthy
// observations) has that one interface removed inside the namespace recorded at
// ADD — only after the namespace's dev+inode match the lease's NetNS.Dev/Ino and
// differ from the host's — and is released once the address is verified absent.
// The reconciler never changes any other namespace and never the host's.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/ledger"
)

// Runtime is what the reconciler asks of the container runtime. Implemented by
// *cri.Client and *cri.Reconnecting (and by fakes in tests).
//
// Contract: ListSandboxes returns every sandbox in every state, or an error; it
// never returns a partial list without an error on purpose, but the reconciler does
// not rely on that. SandboxStatus returns one sandbox's state, or an error wrapping
// cri.ErrNotFound when the runtime does not know the ID — the only error taken as
// evidence of absence. Both must be bounded by a timeout.
type Runtime interface {
	ListSandboxes(ctx context.Context) ([]cri.Sandbox, error)
	SandboxStatus(ctx context.Context, id string) (cri.Sandbox, error)
}

var (
	_ Runtime = (*cri.Client)(nil)
	_ Runtime = (*cri.Reconnecting)(nil)
)

// NSState is what the namespace recorded at ADD says about a lease's addresses.
type NSState int

// Namespace verdicts.
const (
	// NSUnknown: the namespace could not be inspected (an error, or the recorded
	// identity is the host's and is refused). A path whose identity was not recorded
	// is judged by what is at it now (see NSFS), never left unknown for that alone.
	NSUnknown NSState = iota
	// NSNotRecorded: the lease has no namespace path.
	NSNotRecorded
	// NSGone: nothing exists at the recorded path, or another namespace or file does.
	NSGone
	// NSAddrAbsent: the recorded namespace exists and holds none of the addresses.
	NSAddrAbsent
	// NSAddrPresent: the recorded namespace still holds one of the addresses.
	NSAddrPresent
)

func (s NSState) String() string {
	switch s {
	case NSNotRecorded:
		return "netns not recorded"
	case NSGone:
		return "netns gone"
	case NSAddrAbsent:
		return "address absent from netns"
	case NSAddrPresent:
		return "address configured in netns"
	default:
		return "netns unknown"
	}
}

// Netns inspects the namespaces recorded at ADD.
//
// Contract: Probe never changes anything; it checks the namespace's identity
// against ns.Dev/Ino before looking inside and refuses the host's namespace.
// Reclaim removes the one interface carrying one of ips inside the namespace
// recorded at ADD, after the same identity checks; it never touches any other
// namespace. Both are safe for concurrent use.
type Netns interface {
	Probe(ns ledger.NetNS, ips []netip.Prefix) (NSState, string)
	Reclaim(ns ledger.NetNS, ips []netip.Prefix) (string, error)
}

// Options configure a Reconciler.
type Options struct {
	Ledger  *ledger.Ledger
	Runtime Runtime
	Netns   Netns
	// Interval between rounds; Grace is how long an abandoned lease must look so.
	Interval, Grace time.Duration
	// ReclaimStranded enables removing stranded interfaces after StrandedGrace.
	ReclaimStranded bool
	StrandedGrace   time.Duration
	// Clock gives the wall time a round is recorded at and the monotonic time every
	// how-long decision is taken on; default clock.NewSystem().
	Clock  clock.Clock
	Logger *slog.Logger
}

// Sandbox verdicts, as shown to operators (View.Sandbox) and answered to an
// operator's release by the agent. READY and NOTREADY are the runtime's states;
// GONE is its NotFound; UNKNOWN is no evidence.
const (
	SandboxReady    = "READY"
	SandboxNotReady = "NOTREADY"
	SandboxGone     = "GONE"
	SandboxUnknown  = "UNKNOWN"
)

// Class is what the reconciler holds against a lease.
type Class int

// Classes of a lease.
const (
	ClassNone      Class = iota // not suspected
	ClassAbandoned              // releasable once it has held long enough
	ClassStranded               // address still configured: kept (reclaimable with the flag)
	ClassDoubt                  // suspected but unverifiable: kept
)

// suspicion is what the reconciler holds against one lease.
type suspicion struct {
	class   Class
	created time.Time     // the lease's Created: identity of the holder
	first   time.Duration // Clock.Mono at the first observation
	count   int           // observations in trustworthy rounds
	reason  ledger.Reason
	detail  string
}

// sight is when this process first saw one holder of a key (Clock.Mono). A lease's
// Created is a wall time written by whichever process made it, under whatever the
// wall clock said then; its age for every decision is counted from the first sight
// instead, which a clock step cannot move. A lease made before this process started
// is first seen at the first round, so a restart can only delay a release.
type sight struct {
	created time.Time // the holder's Created (identity, not arithmetic)
	at      time.Duration
}

// Round is the outcome of one reconciliation round.
type Round struct {
	At       time.Time // wall time, for records
	Err      error     // listing failed: nothing was done
	Doubtful bool      // releases were withheld
	Why      string
	Released []ledger.Lease
	Reasons  []ledger.Reason
	Stranded int
	Suspect  int
	// Unknown counts leases with no evidence this round (a status or probe error
	// touching them alone); they are kept as they were.
	Unknown int
}

// Reconciler compares leases with sandboxes. It is safe for concurrent use; rounds
// are serialized.
type Reconciler struct {
	o   Options
	log *slog.Logger

	round sync.Mutex // one round at a time

	mu         sync.Mutex
	sus        map[ledger.Key]*suspicion
	seen       map[ledger.Key]sight
	views      map[ledger.Key]View
	prevListed map[string]bool // sandboxes listed before and not since found gone
	listed     bool            // a listing has succeeded
	runtimeOK  bool
	last       Round
}

// New checks o and returns a Reconciler.
func New(o Options) (*Reconciler, error) {
	if o.Ledger == nil || o.Runtime == nil || o.Netns == nil {
		return nil, errors.New("reconcile: ledger, runtime and netns are required")
	}
	if o.Interval <= 0 || o.Grace <= 0 {
		return nil, errors.New("reconcile: interval and grace must be positive")
	}
	if o.ReclaimStranded && o.StrandedGrace <= 0 {
		return nil, errors.New("reconcile: stranded grace must be positive")
	}
	if o.Clock == nil {
		o.Clock = clock.NewSystem()
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Reconciler{o: o, log: log, sus: map[ledger.Key]*suspicion{}, seen: map[ledger.Key]sight{}, views: map[ledger.Key]View{}}, nil
}

// Run reconciles at once and then every Interval until ctx is done.
func (r *Reconciler) Run(ctx context.Context) {
	t := time.NewTicker(r.o.Interval)
	defer t.Stop()
	for {
		r.Reconcile(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ageLocked returns how long ago (by Clock.Mono) this process first saw ls's holder,
// recording the sight now if it never did. r.mu must be held.
func (r *Reconciler) ageLocked(ls ledger.Lease, now time.Duration) time.Duration {
	s, ok := r.seen[ls.Key]
	if !ok || !s.created.Equal(ls.Created) {
		r.seen[ls.Key] = sight{created: ls.Created, at: now}
		return 0
	}
	return now - s.at
}

// age is ageLocked for callers outside a round (the Guard's questions).
func (r *Reconciler) age(ls ledger.Lease) time.Duration {
	now := r.o.Clock.Mono()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ageLocked(ls, now)
}

// observation is one round's evidence about one lease.
type observation struct {
	ls      ledger.Lease
	sandbox string // verdict
	status  string // where the verdict came from: the listing, SandboxStatus, its error
	ns      NSState
	nsInfo  string
}

// statusAnswer is one SandboxStatus answer, asked once per sandbox per round.
type statusAnswer struct {
	sb  cri.Sandbox
	err error
}

// decision is one lease's outcome in a round, logged with its evidence.
type decision struct {
	level slog.Level
	what  string
	o     observation
	s     *suspicion
	age   time.Duration
}

// Reconcile runs one round.
func (r *Reconciler) Reconcile(ctx context.Context) Round {
	r.round.Lock()
	defer r.round.Unlock()
	now := r.o.Clock.Mono()
	rd := Round{At: r.o.Clock.Now()}
	sbs, err := r.o.Runtime.ListSandboxes(ctx)
	if err != nil {
		rd.Err = err
		r.mu.Lock()
		r.runtimeOK = false
		r.last = rd
		r.mu.Unlock()
		r.log.Warn("reconcile: runtime listing failed; no decision this round, every lease kept", "err", err)
		return rd
	}
	obs, listed, history := r.observe(ctx, sbs, &rd)
	r.mu.Lock()
	decisions, acts := r.judgeLocked(obs, listed, history, now, &rd)
	r.mu.Unlock()
	r.apply(ctx, decisions, acts, now, &rd)
	r.log.Debug("reconcile: round", "sandboxes", len(sbs), "leases", len(obs), "suspect", rd.Suspect, "stranded", rd.Stranded, "unknown", rd.Unknown, "released", len(rd.Released), "doubtful", rd.Doubtful)
	r.mu.Lock()
	r.last = rd
	r.mu.Unlock()
	return rd
}

// observe is a round's first phase: the evidence about every lease, from the
// listing sbs, SandboxStatus (asked once per sandbox the listing lacks) and the
// namespace probe. It also finds whether the listing contradicts the previous one
// (rd.Doubtful). It returns the observations, the listing by ID, and the
// sandboxes listed before that stay in the history though this listing lacks them.
func (r *Reconciler) observe(ctx context.Context, sbs []cri.Sandbox, rd *Round) ([]observation, map[string]cri.Sandbox, []string) {
	listed := make(map[string]cri.Sandbox, len(sbs))
	for _, s := range sbs {
		listed[s.ID] = s
	}
	r.mu.Lock()
	prev := r.prevListed
	if len(sbs) == 0 && r.listed && len(prev) > 0 {
		rd.Doubtful, rd.Why = true, fmt.Sprintf("empty listing after a listing of %d sandboxes", len(prev))
	}
	r.mu.Unlock()

	leases := r.o.Ledger.Leases("")
	obs := make([]observation, 0, len(leases))
	asked := map[string]statusAnswer{}
	var history []string // known sandboxes missing from this listing, listed before
	for _, ls := range leases {
		id := ls.Key.ContainerID
		o := observation{ls: ls, sandbox: SandboxUnknown}
		sb, ok := listed[id]
		if ok {
			o.status = "listed " + sb.State.String()
		} else {
			a, done := asked[id]
			if !done {
				a.sb, a.err = r.o.Runtime.SandboxStatus(ctx, id)
				asked[id] = a
			}
			switch {
			case errors.Is(a.err, cri.ErrNotFound):
				o.sandbox, o.status = SandboxGone, "not listed; status: not found"
			case a.err != nil:
				// No evidence about this sandbox, and only about this sandbox: its
				// leases keep what they had; the others are judged as usual.
				o.status = "not listed; status failed: " + a.err.Error()
				if prev[id] {
					history = append(history, id) // still unexplained: keep it in the history
				}
			case prev[id]:
				// Listed before, missing now, and the runtime still knows it: the
				// listing is partial, so this round's absences are not trusted. It
				// stays in the history until the runtime lists it or forgets it.
				sb, ok = a.sb, true
				history = append(history, id)
				o.status = "missing from the listing though listed before; status " + a.sb.State.String()
				if !rd.Doubtful {
					rd.Doubtful, rd.Why = true, fmt.Sprintf("partial listing: sandbox %.12s was listed before, is missing now, but the runtime still knows it", id)
				}
			default:
				// Never listed: most likely created after the listing (a pod
				// starting). Its status is this lease's evidence; the round stands.
				sb, ok = a.sb, true
				o.status = "not listed (created after the listing?); status " + a.sb.State.String()
			}
		}
		if ok {
			switch sb.State {
			case cri.StateReady:
				o.sandbox = SandboxReady
			case cri.StateNotReady:
				o.sandbox = SandboxNotReady
			}
		}
		if o.sandbox == SandboxGone || o.sandbox == SandboxNotReady {
			o.ns, o.nsInfo = r.o.Netns.Probe(ls.NetNS, ls.IPs)
		}
		obs = append(obs, o)
	}
	return obs, listed, history
}

// act is a decision the apply phase carries out: a release, after reclaiming the
// stranded interface when reclaim is set.
type act struct {
	decision
	reason  ledger.Reason
	detail  string
	reclaim bool
}

// judgeLocked is a round's second phase, under r.mu: it records the listing as the
// history, ages every suspicion by the observations, keeps the views operators see,
// forgets the keys no longer held, and returns the decisions to log and the acts to
// carry out. r.mu must be held.
func (r *Reconciler) judgeLocked(obs []observation, listed map[string]cri.Sandbox, history []string, now time.Duration, rd *Round) ([]decision, []act) {
	r.listed, r.runtimeOK = true, true
	r.prevListed = make(map[string]bool, len(listed)+len(history))
	for id := range listed {
		r.prevListed[id] = true
	}
	for _, id := range history {
		r.prevListed[id] = true
	}
	live := make(map[ledger.Key]bool, len(obs))
	var acts []act
	decisions := make([]decision, 0, len(obs))
	views := make(map[ledger.Key]View, len(obs))
	for _, o := range obs {
		k := o.ls.Key
		live[k] = true
		age := r.ageLocked(o.ls, now)
		// maybe in creation: containerd lists a sandbox only after its CNI ADD
		young := o.sandbox == SandboxGone && age < r.o.Grace
		cls, reason, detail := judge(o.sandbox, o.ns)
		if o.nsInfo != "" {
			detail += " (" + o.nsInfo + ")"
		}
		evidence := false
		s := r.sus[k]
		if s != nil && !s.created.Equal(o.ls.Created) {
			s = nil // another holder under the same key
		}
		d := decision{level: slog.LevelInfo, o: o, age: age}
		switch {
		case o.sandbox == SandboxReady:
			delete(r.sus, k)
			s = nil
			d.level, d.what = slog.LevelDebug, "keep: sandbox READY"
		case young:
			// not evidence yet, but the clock starts now
			if s == nil && cls != ClassNone && o.ns != NSUnknown {
				s = &suspicion{class: cls, created: o.ls.Created, first: now, reason: reason, detail: detail}
				r.sus[k] = s
			}
			d.level, d.what = slog.LevelDebug, fmt.Sprintf("keep: maybe in creation (first seen %s ago, grace %s)", age.Round(time.Millisecond), r.o.Grace)
		case o.sandbox == SandboxUnknown || o.ns == NSUnknown:
			// no evidence: keep whatever we suspected, unchanged
			rd.Unknown++
			d.level, d.what = slog.LevelWarn, "keep: no evidence this round"
		case cls == ClassNone:
			delete(r.sus, k)
			s = nil
			d.what = "keep: nothing suspicious"
		default:
			if s == nil || s.class != cls {
				s = &suspicion{class: cls, created: o.ls.Created, first: now}
				r.sus[k] = s
			}
			s.reason, s.detail = reason, detail
			evidence = true
			if !rd.Doubtful {
				s.count++
			}
		}
		d.s = s
		v := View{Sandbox: o.sandbox}
		if young {
			v.Sandbox = SandboxUnknown
		} else if s != nil {
			v.Class = s.class
			v.Suspect = fmt.Sprintf("%s for %s, %d observations", s.detail, (now - s.first).Round(time.Millisecond), s.count)
			switch s.class {
			case ClassAbandoned:
				rd.Suspect++
			case ClassStranded:
				rd.Stranded++
				v.Suspect = "stranded: " + v.Suspect
			case ClassDoubt:
				rd.Suspect++
			}
		}
		views[k] = v
		if !evidence {
			decisions = append(decisions, d)
			continue
		}
		held := now - s.first
		switch {
		case rd.Doubtful:
			d.what = "suspect: round doubtful, no release (" + rd.Why + ")"
		case s.class == ClassDoubt:
			d.what = "keep: suspected but cannot be verified"
		case s.count < 2:
			d.what = "suspect: one observation, a second is needed"
		case s.class == ClassAbandoned && held >= r.o.Grace:
			d.what = "release"
			acts = append(acts, act{decision: d, reason: s.reason, detail: fmt.Sprintf("%s for %s over %d observations", s.detail, held.Round(time.Millisecond), s.count)})
			continue
		case s.class == ClassAbandoned:
			d.what = fmt.Sprintf("suspect: within grace (%s of %s)", held.Round(time.Millisecond), r.o.Grace)
		case s.class == ClassStranded && r.o.ReclaimStranded && o.sandbox == SandboxNotReady && o.ls.NetNS.Ino == 0:
			d.what = "keep: stranded; not reclaimable, the namespace's identity was not recorded at ADD"
		case s.class == ClassStranded && r.o.ReclaimStranded && o.sandbox == SandboxNotReady && held >= r.o.StrandedGrace:
			d.what = "reclaim stranded interface, then release"
			acts = append(acts, act{decision: d, reason: ledger.ReasonReconcileNotReady, reclaim: true})
			continue
		case s.class == ClassStranded:
			d.what = "keep: stranded, the address is still configured"
		}
		decisions = append(decisions, d)
	}
	for k := range r.sus {
		if !live[k] {
			delete(r.sus, k)
		}
	}
	for k := range r.seen {
		if !live[k] {
			delete(r.seen, k)
		}
	}
	r.views = views
	return decisions, acts
}

// apply is a round's last phase, without r.mu: it logs the decisions and carries out
// the acts, each release conditional on the lease still being the one judged.
func (r *Reconciler) apply(ctx context.Context, decisions []decision, acts []act, now time.Duration, rd *Round) {
	if rd.Doubtful {
		r.log.Warn("reconcile: doubtful round; no release", "why", rd.Why)
	}
	for _, d := range decisions {
		r.logDecision(ctx, d, now)
	}
	for _, a := range acts {
		if a.reclaim {
			what, err := r.o.Netns.Reclaim(a.o.ls.NetNS, a.o.ls.IPs)
			if err != nil {
				a.level, a.what = slog.LevelError, "keep: reclaiming the stranded interface failed: "+err.Error()
				r.logDecision(ctx, a.decision, now)
				continue
			}
			// release only on verified absence
			st, info := r.o.Netns.Probe(a.o.ls.NetNS, a.o.ls.IPs)
			if st != NSAddrAbsent && st != NSGone {
				a.level, a.what = slog.LevelError, fmt.Sprintf("keep: stranded address still present after reclaim (%s %s)", st, info)
				r.logDecision(ctx, a.decision, now)
				continue
			}
			a.detail = "stranded for " + (now - r.firstOf(a.o.ls.Key)).Round(time.Millisecond).String() + "; " + what
		}
		rel, ok, err := r.o.Ledger.ReleaseIfCreated(a.o.ls.Key, a.o.ls.Created, a.reason, a.detail)
		if err != nil {
			a.level, a.what = slog.LevelError, "keep: release failed: "+err.Error()
			r.logDecision(ctx, a.decision, now)
			continue
		}
		r.mu.Lock()
		delete(r.sus, a.o.ls.Key)
		delete(r.views, a.o.ls.Key)
		r.mu.Unlock()
		if !ok {
			a.what = "nothing released: the attachment was released or taken by another holder since the round began"
			r.logDecision(ctx, a.decision, now)
			continue
		}
		rd.Released = append(rd.Released, rel)
		rd.Reasons = append(rd.Reasons, a.reason)
		a.what = "release " + string(a.reason) + ": " + a.detail
		r.logDecision(ctx, a.decision, now, slog.String("ips", fmt.Sprint(rel.IPs)))
	}
}

// logDecision writes one line for one lease's decision with its evidence: the
// sandbox verdict and where it came from, the namespace probe, the observations that
// counted and how long the suspicion and the lease (since first seen) have lasted.
func (r *Reconciler) logDecision(ctx context.Context, d decision, now time.Duration, extra ...slog.Attr) {
	if !r.log.Enabled(ctx, d.level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("attachment", d.o.ls.Key.String()),
		slog.String("decision", d.what),
		slog.String("sandbox", d.o.sandbox),
		slog.String("status", d.o.status),
	}
	if d.o.sandbox == SandboxGone || d.o.sandbox == SandboxNotReady {
		attrs = append(attrs, slog.String("netns", d.o.ns.String()))
		if d.o.nsInfo != "" {
			attrs = append(attrs, slog.String("netnsInfo", d.o.nsInfo))
		}
	}
	obs := 0
	if d.s != nil {
		obs = d.s.count
		attrs = append(attrs, slog.Duration("suspectedFor", (now-d.s.first).Round(time.Millisecond)))
	}
	attrs = append(attrs, slog.Int("observations", obs), slog.Duration("seenFor", d.age.Round(time.Millisecond)))
	attrs = append(attrs, extra...)
	r.log.LogAttrs(ctx, d.level, "reconcile: decision", attrs...)
}

func (r *Reconciler) firstOf(k ledger.Key) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.sus[k]; s != nil {
		return s.first
	}
	return r.o.Clock.Mono()
}

// judge classifies one observation. Only GONE and NOTREADY can be suspected.
func judge(sandbox string, ns NSState) (Class, ledger.Reason, string) {
	switch sandbox {
	case SandboxGone:
		switch ns {
		case NSGone, NSAddrAbsent, NSNotRecorded:
			return ClassAbandoned, ledger.ReasonReconcileGone, "sandbox gone from the runtime, " + ns.String()
		case NSAddrPresent:
			return ClassStranded, "", "sandbox gone from the runtime but " + ns.String()
		}
	case SandboxNotReady:
		switch ns {
		case NSGone, NSAddrAbsent:
			return ClassAbandoned, ledger.ReasonReconcileNotReady, "sandbox NOTREADY, " + ns.String()
		case NSAddrPresent:
			return ClassStranded, "", "sandbox NOTREADY and " + ns.String()
		case NSNotRecorded:
			return ClassDoubt, "", "sandbox NOTREADY, " + ns.String() + ": cannot verify, kept"
		}
	}
	return ClassNone, "", ""
}

// abandoned reports whether a sandbox verdict and a namespace verdict together
// show that the holder cannot use its address (the evidence for supersession and GC).
func abandoned(sandbox string, ns NSState) bool {
	c, _, _ := judge(sandbox, ns)
	return c == ClassAbandoned
}

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
// evidence. A lease first seen by this process less than Grace ago whose sandbox the
// runtime does not know may be in creation (its ADD may not have returned yet): kept.
func (r *Reconciler) guard(ctx context.Context, who string, ls ledger.Lease) bool {
	age := r.age(ls)
	sb, status := r.sandboxOf(ctx, ls.Key.ContainerID)
	o := observation{ls: ls, sandbox: sb, status: status}
	d := decision{level: slog.LevelInfo, o: o, age: age}
	switch {
	case sb == SandboxGone && age < r.o.Grace:
		d.what = fmt.Sprintf("%s: keep: maybe in creation (first seen %s ago, grace %s)", who, age.Round(time.Millisecond), r.o.Grace)
	case sb != SandboxGone && sb != SandboxNotReady:
		d.what = who + ": keep: the runtime does not say the sandbox is gone or NOTREADY"
	default:
		d.o.ns, d.o.nsInfo = r.o.Netns.Probe(ls.NetNS, ls.IPs)
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

// Last returns the last round.
func (r *Reconciler) Last() Round {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}
