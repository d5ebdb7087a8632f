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
//   - the namespace is gone (see "Gone needs positive evidence" below), or it
//     holds none of the lease's addresses: the holder cannot use the address, the
//     lease is "abandoned";
//   - the namespace still holds one of the lease's addresses: the lease is
//     "stranded" (e.g. a chained plugin failed ADD and DEL, and the interface stays
//     configured in the NOTREADY sandbox). A stranded lease is reported and kept,
//     so the address is never handed to another pod while it is configured there;
//   - no namespace was recorded, or the agent cannot see it (NSNotVisible): GONE
//     is abandoned (the runtime's NotFound is the evidence), NOTREADY is only
//     suspected (nothing can verify it) and kept;
//   - the namespace cannot be inspected: no evidence;
//   - a path whose identity was not recorded at ADD is judged by what is at it
//     now (see [NSFS]), so such a lease is not kept UNKNOWN forever.
//
// # Gone needs positive evidence
//
// The agent often runs in a container: a namespace directory not mounted into it,
// or mounted without propagation, shows nothing, or the bare mount point (a plain
// file of another filesystem), where the runtime has live namespaces. So the
// absence of a namespace as the agent sees it is no evidence. A namespace is gone
// only when:
//
//   - the lease was allocated on another boot (Lease.BootID is not the boot
//     Options.Boot reads): nothing is probed, nsfs inodes repeat across boots;
//   - the recorded path holds another namespace (the recorded nsfs device,
//     another inode);
//   - the path is /proc/PID/… and PID is gone while the agent's /proc shows the
//     kernel's initial PID namespace (the runtime's PIDs are the agent's);
//   - the path is missing or a plain file, and the agent is in the runtime's
//     mount namespace (Options.Mounts: a systemd unit beside its runtime), or a
//     READY sandbox's namespace in the same directory, allocated at or after this
//     lease, stats to its recorded identity: the agent sees the mounts made there
//     since this lease's ADD.
//
// Anything else is NSNotVisible: a NOTREADY sandbox's lease is kept (the guard
// answers no for supersession and GC too), shown suspect "netns directory not
// visible" with the mount that fixes it; doctor runs the same canary (Resolves)
// on READY sandboxes' namespaces and warns of the directory.
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
// is never subtracted from. A lease's age is counted from its allocation when the
// lease carries a boot clock reading (Lease.BootID, SinceBoot: CLOCK_BOOTTIME at
// Allocate) of the boot Options.Boot reads now, so an agent restart on the same
// boot does not make old leases young again. Without such a reading (another boot,
// an old record, no boot clock) it is counted from this process's first sight of
// the lease (a round, or a Guard question): a lease made before a restart is first
// seen at the first round, so a restart can delay a release, never hurry it.
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
// A lease younger than Grace (its age as above) whose sandbox the runtime does not
// know is assumed to be in creation (containerd adds a sandbox to its store only
// after CNI ADD): it is not shown as suspect and its observations do not count
// toward the two confirmations, but its clock starts at the first such observation.
//
// Every round logs one line per lease ("reconcile: decision") with the decision and
// its evidence: the sandbox verdict and where it came from (the listing,
// SandboxStatus or its error), the namespace probe, the observations that counted,
// how long it has been suspected and seen. READY and in-creation leases log at
// Debug, failures to get evidence at Warn, everything else at Info.
//
// # The API server, a second witness never heard alone
//
// With Options.API (the agent watching its node's pods), what the Kubernetes API
// says of a lease's pod is evidence too, but only beside the runtime's: it is asked
// only about a lease whose sandbox this round judged NOTREADY or GONE, in a round
// the listing made trustworthy, and it only ever turns a lease the runtime alone
// would keep into one that may go. "Finished" means the pod named by the lease's
// UID (else its namespace and name) is absent from the watch's cache, or its phase
// is Succeeded or Failed. An absence counts only when the cache can vouch for it
// (see PodWitness): it listed after the lease was created, has had no watch error
// since, and is not blind; a watch that has not listed says nothing. Each round
// tells the witness of every READY sandbox's pod, so that a cache lacking one
// stops vouching. An act (a release, an interface removed) that rests on a pod's
// deletion first asks the API server itself; unless it answers that the pod is
// gone, the lease is kept and the act waits for a later round.
// It decides two cases the runtime cannot:
//
//   - a NOTREADY sandbox whose namespace was not recorded at ADD (otherwise kept
//     as unverifiable) is abandoned when its pod is finished (not one whose
//     namespace is merely invisible here: that one may still hold the address);
//   - a stranded lease (its address still configured in a NOTREADY sandbox's
//     namespace) whose pod is finished has that one interface removed
//     inside the namespace recorded at ADD, after the identity checks below, and
//     is released once the address is verified absent, whether ReclaimStranded is
//     set or not. A NOTREADY sandbox never runs again (the kubelet makes a new
//     one for a pod that goes on); what the runtime cannot tell is whether the
//     kubelet still means to tear this one down through CNI, and a finished pod
//     says that nothing waits for the address.
//
// Such a suspicion rests on both witnesses: it starts when the API's evidence is
// first seen with the runtime's, is reset when either goes, and needs Grace and two
// trustworthy observations like any other. A stale cache, an API server that is
// down or restored from an old backup, or a pod re-created under the same name
// (another UID) can make a live pod look finished, but a live pod's sandbox is
// READY, and a READY sandbox's lease is never released (invariant 2).
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
	// NSGone: the recorded namespace is gone, on positive evidence (see the
	// package comment): another namespace at the path, another boot, a gone
	// process of the host's PID namespace, or a missing path in a directory shown
	// visible.
	NSGone
	// NSAddrAbsent: the recorded namespace exists and holds none of the addresses.
	NSAddrAbsent
	// NSAddrPresent: the recorded namespace still holds one of the addresses.
	NSAddrPresent
	// NSNotVisible: the agent does not see the recorded namespace (its path or
	// directory missing, or a plain file of another filesystem where it was
	// mounted) and nothing shows it gone: nothing can be told of the namespace, as
	// when none was recorded, except that it may still hold the address.
	NSNotVisible
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
	case NSNotVisible:
		return "netns directory not visible"
	default:
		return "netns unknown"
	}
}

// Netns inspects the namespaces recorded at ADD.
//
// Contract: Probe never changes anything; it checks the namespace's identity
// against ns.Dev/Ino before looking inside and refuses the host's namespace.
// Reclaim removes the lease's own interface (ifname, the key's CNI_IFNAME) when it
// carries one of ips inside the namespace recorded at ADD, after the same identity
// checks; when one of ips is on any other interface, or ifname is not a veth, it
// deletes nothing and returns an error wrapping ErrNotOwnInterface. It never
// touches any other namespace. Both are safe for concurrent use.
type Netns interface {
	Probe(ns ledger.NetNS, ips []netip.Prefix) (NSState, string)
	Reclaim(ns ledger.NetNS, ifname string, ips []netip.Prefix) (string, error)
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
	Clock clock.Clock
	// Boot, when set, is the boot clock the ledger stamps new leases with
	// (ledger.Options.Boot): a lease stamped on the boot it reads now is as old as
	// CLOCK_BOOTTIME says since its allocation. Nil counts every lease's age from
	// its first sight.
	Boot clock.Boot
	// API, when set, is the Kubernetes API's view of this node's pods: the second
	// witness (see the package doc). Nil: the runtime is the only witness.
	API PodWitness
	// Mounts, when set, tells whether the agent sees the runtime's mounts (is in
	// its mount namespace) and the evidence: then a namespace the agent does not
	// see is gone (see "Gone needs positive evidence"). RuntimeMounts gives it for
	// a CRI endpoint. Nil: never known.
	Mounts func() (bool, string)
	Logger *slog.Logger
}

// PodWitness tells what the Kubernetes API says of this node's pods. Implemented
// by *kubenode.Pods.
//
// Contract: PodSince never calls the API server (it answers from a watch's cache)
// and is safe for concurrent use, as are the others. known is false when nothing
// can be told; then inAPI says whether the pod exists and phase is its
// status.phase ("" when it has none yet). A pod's absence is an answer only when
// the cache listed after since (the lease's creation), is not broken since, and is
// not blind. A non-empty uid is matched by UID only, so a pod re-created under the
// same name is another pod; without one, the pod is matched by namespace and name.
//
// ReadySandbox is told of every lease's pod whose sandbox the runtime reports
// READY, so that a cache lacking such a pod stops vouching for absences (it is
// blind: a field selector that lists nothing). It may ask the API server, bounded
// by ctx.
//
// Deleted asks the API server itself (not the cache) whether the pod is deleted:
// not found, or another UID under its name. An error means nothing is known.
type PodWitness interface {
	PodSince(namespace, name, uid string, since time.Time) (phase string, inAPI, known bool)
	ReadySandbox(ctx context.Context, namespace, name, uid string)
	Deleted(ctx context.Context, namespace, name, uid string) (bool, error)
}

// podDeleted is the API's evidence that a pod is deleted: its absence from the
// watch's cache, confirmed by the API server itself before anything is done on it.
const podDeleted = "pod deleted from the API"

// podFinished is what w says of the pod of lease ls: why it is finished
// (podDeleted, "pod Succeeded in the API"), or "" when it is not, or w cannot
// tell, or the lease names no pod.
func podFinished(w PodWitness, ls ledger.Lease) string {
	p := ls.Pod
	if w == nil || !namesPod(p) {
		return ""
	}
	phase, in, known := w.PodSince(p.Namespace, p.Name, p.UID, ls.Created)
	switch {
	case !known:
		return ""
	case !in:
		return podDeleted
	case phase == "Succeeded" || phase == "Failed":
		return "pod " + phase + " in the API"
	}
	return ""
}

func namesPod(p ledger.Pod) bool { return p.UID != "" || (p.Namespace != "" && p.Name != "") }

// confirmDeleted asks the API server whether the pod of ls is deleted, before an
// act that rests on it: "" when it is, else why the act waits.
func confirmDeleted(ctx context.Context, w PodWitness, ls ledger.Lease) string {
	deleted, err := w.Deleted(ctx, ls.Pod.Namespace, ls.Pod.Name, ls.Pod.UID)
	switch {
	case err != nil:
		return "the API server could not confirm the pod's deletion (" + err.Error() + ")"
	case !deleted:
		return "the API server still has the pod (the watch's cache lacked it)"
	}
	return ""
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
	// byAPI: the class rests on the API's evidence too (a doubt or a stranded
	// lease whose pod is finished); the suspicion restarts when that changes.
	byAPI  bool
	reason ledger.Reason
	detail string
}

// sight is when one holder of a key was allocated, on Clock.Mono (before this
// process started it is negative), taken at this process's first sight of it. A
// lease's Created is a wall time written by whichever process made it, under
// whatever the wall clock said then; it is never subtracted from. When the lease's
// boot clock reading is of this boot, the allocation is placed as long before the
// sight as CLOCK_BOOTTIME says; otherwise the sight itself stands for it, so a lease
// made before this process started without such a reading is first seen at the
// first round, and a restart can only delay its release.
type sight struct {
	created time.Time // the holder's Created (identity, not arithmetic)
	at      time.Duration
}

// bootReading is one reading of Options.Boot, taken before the Clock.Mono reading it
// goes with, so that an age it gives is short by the gap between them, never long.
type bootReading struct {
	id    string
	since time.Duration
	ok    bool
}

func (r *Reconciler) readBoot() bootReading {
	if r.o.Boot == nil {
		return bootReading{}
	}
	id, since, ok := r.o.Boot.Boot()
	return bootReading{id: id, since: since, ok: ok}
}

// allocatedAgo is how long ago, by CLOCK_BOOTTIME, ls was allocated, when its
// reading is of the boot b reads.
func (b bootReading) allocatedAgo(ls ledger.Lease) (time.Duration, bool) {
	if !b.ok || ls.BootID == "" || ls.BootID != b.id || ls.SinceBoot <= 0 || ls.SinceBoot > b.since {
		return 0, false
	}
	return b.since - ls.SinceBoot, true
}

// Round is the outcome of one reconciliation round.
type Round struct {
	At       time.Time // wall time, for records
	Err      error     // listing failed: nothing was done
	Doubtful bool      // releases were withheld
	Why      string
	Released []ledger.Lease
	// Reasons and Details are each release's reason and evidence, in the order of
	// Released.
	Reasons  []ledger.Reason
	Details  []string
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

// ageLocked returns ls's age on Clock.Mono: since its allocation when its boot
// clock reading is of boot b, else since this process first saw its holder. The
// first sight is recorded now if there was none; b is read before now. r.mu must
// be held.
func (r *Reconciler) ageLocked(ls ledger.Lease, b bootReading, now time.Duration) time.Duration {
	s, ok := r.seen[ls.Key]
	if !ok || !s.created.Equal(ls.Created) {
		s = sight{created: ls.Created, at: now}
		if ago, ok := b.allocatedAgo(ls); ok {
			s.at = now - ago
		}
		r.seen[ls.Key] = s
	}
	return now - s.at
}

// age is ageLocked for callers outside a round (the Guard's questions).
func (r *Reconciler) age(ls ledger.Lease) time.Duration {
	b := r.readBoot()
	now := r.o.Clock.Mono()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ageLocked(ls, b, now)
}

// Last returns the last round.
func (r *Reconciler) Last() Round {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}
