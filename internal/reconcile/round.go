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

// observation is one round's evidence about one lease.
type observation struct {
	ls      ledger.Lease
	sandbox string // verdict
	status  string // where the verdict came from: the listing, SandboxStatus, its error
	ns      NSState
	nsInfo  string
	api     string // the API's evidence that the pod is finished, "" when none
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
	boot := r.readBoot()
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
	obs, listed, history := r.observe(ctx, sbs, boot, &rd)
	r.mu.Lock()
	decisions, acts := r.judgeLocked(obs, listed, history, boot, now, &rd)
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
func (r *Reconciler) observe(ctx context.Context, sbs []cri.Sandbox, boot bootReading, rd *Round) ([]observation, map[string]cri.Sandbox, []string) {
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
	wit := newWitnesses(leases, func(ls ledger.Lease) bool { return listed[ls.Key.ContainerID].State == cri.StateReady })
	wit.mounts = r.o.Mounts
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
			o.ns, o.nsInfo = r.probe(ls, boot, wit)
			o.api = podFinished(r.o.API, ls)
		}
		if o.sandbox == SandboxReady && r.o.API != nil && namesPod(ls.Pod) {
			r.o.API.ReadySandbox(ctx, ls.Pod.Namespace, ls.Pod.Name, ls.Pod.UID)
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
func (r *Reconciler) judgeLocked(obs []observation, listed map[string]cri.Sandbox, history []string, boot bootReading, now time.Duration, rd *Round) ([]decision, []act) {
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
		age := r.ageLocked(o.ls, boot, now)
		// maybe in creation: containerd lists a sandbox only after its CNI ADD
		young := o.sandbox == SandboxGone && age < r.o.Grace
		cls, reason, detail, byAPI := judgeWith(o.sandbox, o.ns, o.api)
		if o.nsInfo != "" {
			detail += " (" + o.nsInfo + ")"
		}
		if o.api != "" {
			detail += "; " + o.api
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
			d.level, d.what = slog.LevelDebug, fmt.Sprintf("keep: maybe in creation (%s old, grace %s)", age.Round(time.Millisecond), r.o.Grace)
		case o.sandbox == SandboxUnknown || o.ns == NSUnknown:
			// no evidence: keep whatever we suspected, unchanged
			rd.Unknown++
			d.level, d.what = slog.LevelWarn, "keep: no evidence this round"
		case cls == ClassNone:
			delete(r.sus, k)
			s = nil
			d.what = "keep: nothing suspicious"
		default:
			if s == nil || s.class != cls || s.byAPI != byAPI {
				s = &suspicion{class: cls, created: o.ls.Created, first: now, byAPI: byAPI}
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
		case s.class == ClassStranded:
			after, why, may := r.reclaimAfter(s, o.sandbox)
			switch {
			case !may:
				d.what = "keep: stranded, the address is still configured"
			case o.ls.NetNS.Ino == 0:
				d.what = "keep: stranded; not reclaimable (" + why + "), the namespace's identity was not recorded at ADD"
			case held >= after:
				d.what = "reclaim stranded interface (" + why + "), then release"
				acts = append(acts, act{decision: d, reason: ledger.ReasonReconcileNotReady, reclaim: true})
				continue
			default:
				d.what = fmt.Sprintf("keep: stranded; reclaimable (%s) once held %s (%s so far)", why, after, held.Round(time.Millisecond))
			}
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
		if a.s != nil && a.s.byAPI && a.o.api == podDeleted {
			// the cache's word alone never removes an interface or releases
			if why := confirmDeleted(ctx, r.o.API, a.o.ls); why != "" {
				a.level, a.what = slog.LevelWarn, "keep: "+why
				r.logDecision(ctx, a.decision, now)
				continue
			}
			a.o.api += " (confirmed by the API server)"
			a.detail += " (confirmed by the API server)"
		}
		if a.reclaim {
			what, err := r.o.Netns.Reclaim(a.o.ls.NetNS, a.o.ls.Key.IfName, a.o.ls.IPs)
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
			if a.o.api != "" {
				a.detail += "; " + a.o.api
			}
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
		rd.Details = append(rd.Details, a.detail)
		a.what = "release " + string(a.reason) + ": " + a.detail
		r.logDecision(ctx, a.decision, now, slog.String("ips", fmt.Sprint(rel.IPs)))
	}
}

// logDecision writes one line for one lease's decision with its evidence: the
// sandbox verdict and where it came from, the namespace probe, the observations that
// counted, how long the suspicion has lasted and the lease's age (seenFor).
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

// reclaimAfter says whether a stranded lease's interface may be removed, why, and
// after how long the suspicion must have held: its pod is finished (the API's
// evidence, set only for a NOTREADY sandbox) after Grace, or --reclaim-stranded for
// a NOTREADY sandbox after StrandedGrace.
func (r *Reconciler) reclaimAfter(s *suspicion, sandbox string) (time.Duration, string, bool) {
	switch {
	case s.byAPI:
		return r.o.Grace, "its pod is finished", true
	case r.o.ReclaimStranded && sandbox == SandboxNotReady:
		return r.o.StrandedGrace, "--reclaim-stranded", true
	}
	return 0, "", false
}

// judgeWith classifies one observation with the API's evidence that the pod is
// finished (api, "" for none): judge's class, except that a finished pod makes a
// NOTREADY lease whose namespace was not recorded abandoned and a stranded lease
// reclaimable; byAPI reports that the class rests on api.
func judgeWith(sandbox string, ns NSState, api string) (Class, ledger.Reason, string, bool) {
	cls, reason, detail := judge(sandbox, ns)
	if api == "" {
		return cls, reason, detail, false
	}
	switch {
	case cls == ClassDoubt && ns == NSNotRecorded:
		return ClassAbandoned, ledger.ReasonReconcileNotReady, "sandbox NOTREADY, " + ns.String(), true
	case cls == ClassStranded:
		// only a NOTREADY sandbox's: for a gone one, nothing vouches that the
		// namespace at the recorded path is still that sandbox's
		return cls, reason, detail, sandbox == SandboxNotReady
	}
	return cls, reason, detail, false
}

// judge classifies one observation. Only GONE and NOTREADY can be suspected.
func judge(sandbox string, ns NSState) (Class, ledger.Reason, string) {
	switch sandbox {
	case SandboxGone:
		switch ns {
		case NSGone, NSAddrAbsent, NSNotRecorded, NSNotVisible:
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
		case NSNotRecorded, NSNotVisible:
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
