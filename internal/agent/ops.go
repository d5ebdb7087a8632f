package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/choice"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledgerview"
	"github.com/ipledger/ipledger/internal/pool"
)

func errResp(e *api.Error) *api.Response { return &api.Response{Error: e} }

// errorOf maps ledger errors to API error codes.
func errorOf(err error) *api.Error {
	code := api.CodeInternal
	switch {
	// first: a full block whose successor could not be claimed wraps both
	case errors.Is(err, cluster.ErrFenced), errors.Is(err, cluster.ErrNotStarted), errors.Is(err, datastore.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		// the node cannot serve this now (datastore away, lease not provable); the
		// runtime retries
		code = api.CodeUnavailable
	case errors.Is(err, ledger.ErrPoolExhausted):
		code = api.CodeExhausted
	case errors.Is(err, ledger.ErrPoolConflict):
		code = api.CodeConflict
	case errors.Is(err, ledger.ErrInvalidAttachment), errors.Is(err, pool.ErrInvalidRange), errors.Is(err, ledger.ErrUnknownNetwork), errors.Is(err, ledger.ErrAddressUnavailable):
		code = api.CodeInvalid
	case errors.Is(err, ledger.ErrStore), errors.Is(err, ledger.ErrCorrupt):
		code = api.CodeStore
	case errors.Is(err, cluster.ErrPoolMismatch):
		code = api.CodeConflict
	}
	return &api.Error{Code: code, Msg: err.Error()}
}

// Handle answers one request: its changes are durable and their log lines written
// when it returns, and the request is counted in the metrics.
func (s *Server) Handle(ctx context.Context, req api.Request) *api.Response {
	start := time.Now()
	resp, counted := s.handle(ctx, req, nil)
	if counted {
		s.stats.observe(opLabel(req.Op), time.Since(start), resp)
	}
	return resp
}

// handle answers one request, handing the ledger's log lines of an ADD or a DEL to
// later (nil: written before it returns). counted is false for a request the
// metrics do not count (another protocol version).
func (s *Server) handle(ctx context.Context, req api.Request, later *ledger.LogLines) (resp *api.Response, counted bool) {
	if req.Version != api.Version {
		return errResp(&api.Error{Code: api.CodeInvalid, Msg: fmt.Sprintf("protocol version %d; this agent speaks %d: use plugin and agent binaries of one release", req.Version, api.Version)}), false
	}
	switch req.Op {
	case api.OpAdd:
		resp = s.add(ctx, req, later)
	case api.OpDel:
		resp = s.del(ctx, req, later)
	case api.OpCheck:
		resp = s.check(req)
	case api.OpGC:
		resp = s.gc(ctx, req)
	case api.OpStatus:
		resp = s.status(req)
	case api.OpLeases:
		resp = s.leases(req)
	case api.OpAudit:
		resp = s.audit()
	case api.OpHistory:
		resp = s.history(req)
	case api.OpRelease:
		resp = s.release(ctx, req)
	case api.OpPing:
		resp = &api.Response{}
	case api.OpDoctor:
		resp = s.doctor(ctx)
	case api.OpBlocks:
		resp = s.blocks(ctx)
	case api.OpCNI:
		// counted as verb "cni" (the whole call), and its inner requests each under
		// its own verb
		resp = s.cni(ctx, req, later)
	default:
		resp = errResp(&api.Error{Code: api.CodeInvalid, Msg: fmt.Sprintf("op %q is not one of add, del, check, gc, status, leases, audit, history, release, ping, doctor, blocks, cni", clip(req.Op))})
	}
	return resp, true
}

// opUnknown is the metric label of every op the agent does not know: a client's
// string never becomes a label of its own, so no client can grow the metric series.
const opUnknown = "unknown"

func opLabel(op string) string { return bounded(op, verbs, opUnknown) }

// clip shortens a client's string for an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// keyOf is the attachment req names, as the ledger keys it.
func keyOf(req api.Request) ledger.Key { return ledgerKey(req.Key()) }

// ledgerKey is an attachment's key as the ledger keys it.
func ledgerKey(k api.Key) ledger.Key {
	return ledger.Key{Network: k.Network, ContainerID: k.ContainerID, IfName: k.IfName}
}

// podOf is a request's pod as the ledger records it.
func podOf(p api.Pod) ledger.Pod {
	return ledger.Pod{Namespace: p.Namespace, Name: p.Name, UID: p.UID, InfraContainerID: p.InfraContainerID}
}

// netnsOf is a request's network namespace as the ledger records it.
func netnsOf(n api.NetNS) ledger.NetNS {
	return ledger.NetNS{Path: n.Path, Dev: n.Dev, Ino: n.Ino}
}

func (s *Server) view(ls ledger.Lease) api.LeaseView {
	var ranges []pool.RangeSet
	if ps, err := s.cfg.Ledger.Pool(ls.PoolNetwork()); err == nil {
		ranges = ps.Ranges
		for _, r := range ps.Retired { // a lease from before a podCIDR change
			ranges = append(ranges[:len(ranges):len(ranges)], r.Ranges)
		}
	}
	return s.viewIn(ls, ranges)
}

// viewIn is view with the ranges of the lease's pool given. ADD knows them: they are
// its request's, which the ledger allocated from only because they equal the pool's.
// Asking the ledger instead waits for its lock, which the next group commit holds
// through its fsync: in a burst, every ADD's answer would wait for one more commit.
func (s *Server) viewIn(ls ledger.Lease, ranges []pool.RangeSet) api.LeaseView {
	v := ledgerview.Lease(ls, ranges)
	s.annotateBlock(&v, ls)
	s.annotateVerdict(&v)
	s.annotatePod(&v)
	return v
}

func (s *Server) add(ctx context.Context, req api.Request, later *ledger.LogLines) *api.Response {
	k := keyOf(req)
	if err := k.Validate(); err != nil {
		return errResp(errorOf(err))
	}
	if len(req.Ranges) == 0 {
		return errResp(&api.Error{Code: api.CodeInvalid, Msg: "ipam.ranges: missing; give the network's ranges"})
	}
	if n := api.CountRanges(req.Ranges); n > api.MaxRanges {
		return errResp(&api.Error{Code: api.CodeInvalid, Msg: fmt.Sprintf("ipam.ranges: %d ranges; at most %d in one network", n, api.MaxRanges)})
	}
	if aerr := s.networkGate(); aerr != nil {
		return errResp(aerr)
	}
	// ranges that stand for the node's podCIDR follow it when it changes: new
	// leases come from the new podCIDR, the old ones stay until their DEL
	replace := pool.HasPodCIDR(req.Ranges)
	var aerr *api.Error
	if req.Ranges, aerr = s.resolveRanges(req.Ranges); aerr != nil {
		return errResp(aerr)
	}
	unlock := s.locks.lock(k)
	defer unlock()
	// a DEL of this attachment spooled before this ADD was sent is applied first: it
	// must release the lease it was meant for now, not a lease this ADD answers
	if err := s.settleSpooled(k, later); err != nil {
		return errResp(errorOf(err))
	}
	exclude, aerr := excludeOf(req.Exclude)
	if aerr != nil {
		return errResp(aerr)
	}
	areq := ledger.AllocateRequest{Key: k, Pod: podOf(req.Pod), NetNS: netnsOf(req.NetNS), Ranges: req.Ranges, ReplaceRanges: replace, LogLater: later, Why: WhyDefault, Exclude: exclude}
	var chosen *choiceMade
	var sticky *cluster.StickyPod
	if _, held := s.cfg.Ledger.Lease(k); !held {
		// an attachment holding a lease gets it back (ADD is idempotent) whatever
		// its annotations say now
		var aerr *api.Error
		if chosen, aerr = s.choose(ctx, req.Pod); aerr != nil {
			return errResp(aerr)
		}
		if chosen != nil {
			chosen.applyChoice(&areq)
		}
		if sticky, aerr = s.stickyOf(ctx, req.Pod, chosen); aerr != nil {
			return errResp(aerr)
		}
		if aerr = s.reserve(ctx, &areq, chosen, req.Pod, sticky); aerr != nil {
			return errResp(aerr)
		}
	}
	var supersededLeases []ledger.Lease // the holders judged, for their Events
	if req.Pod.UID != "" && s.cfg.Guard != nil {
		if _, held := s.cfg.Ledger.Lease(k); !held {
			var olds []ledger.Lease
			for _, ls := range s.cfg.Ledger.LeasesOfPod(k.Network, req.Pod.UID) {
				if ls.Key != k && ls.Key.IfName == k.IfName {
					olds = append(olds, ls)
				}
			}
			if len(olds) > 0 {
				// release only the holders that were judged: if a key's lease changed
				// since (a new ADD of that attachment), the ledger keeps it
				judged := map[ledger.Key]ledger.Lease{}
				for _, ls := range olds {
					judged[ls.Key] = ls
				}
				for _, ok := range s.cfg.Guard.Supersedable(ctx, olds) {
					if ls, found := judged[ok]; found {
						areq.SupersedeHolders = append(areq.SupersedeHolders, ledger.HolderOf(ls))
						supersededLeases = append(supersededLeases, ls)
					}
				}
			}
		}
	}
	var superseding []ledger.Key
	for _, h := range areq.SupersedeHolders {
		superseding = append(superseding, h.Key)
	}
	superseding = s.held(superseding)
	ls, existed, err := s.allocate(ctx, areq, req.BlockSize, sticky)
	if err != nil {
		if aerr := s.stickyRefused(req.Pod, sticky, err); aerr != nil {
			return errResp(aerr)
		}
		if chosen != nil && errors.Is(err, ledger.ErrAddressUnavailable) {
			return errResp(s.refuseChoice(req.Pod, fmt.Sprintf("%s on %s asks for %s: %v; give a free address inside the network's ranges, or remove the annotation", choice.IP, chosen.ipFrom, chosen.ipValue, err)))
		}
		return errResp(errorOf(err))
	}
	s.countSuperseded(superseding)
	s.supersededEvents(supersededLeases, k)
	if sticky != nil && !existed {
		s.stickyReserved(req.Pod, ls)
	}
	if existed && (replace || ls.Pool != areq.Pool) {
		// the lease may be from ranges the pool had before the podCIDR changed, or
		// from another pool than this request's (a named pool)
		v := s.view(ls)
		return &api.Response{Lease: &v, Existed: existed}
	}
	v := s.viewIn(ls, areq.Ranges) // the pool's: a named pool's when one was chosen
	return &api.Response{Lease: &v, Existed: existed}
}

func (s *Server) del(ctx context.Context, req api.Request, later *ledger.LogLines) *api.Response {
	k := keyOf(req)
	if err := k.Validate(); err != nil {
		return errResp(errorOf(err))
	}
	unlock := s.locks.lock(k)
	defer unlock()
	// a pending spooled DEL of this attachment is applied with it, so that it cannot
	// outlive this DEL and meet a later lease
	if err := s.settleSpooled(k, later); err != nil {
		return errResp(errorOf(err))
	}
	released, ok, err := s.cfg.Ledger.ReleaseLogLater(k, ledger.ReasonDEL, req.Detail, later)
	if err != nil {
		return errResp(errorOf(err))
	}
	resp := &api.Response{}
	if ok {
		resp.Released = 1
		s.returnBorrowed(ctx, released)
	}
	return resp
}

func (s *Server) check(req api.Request) *api.Response {
	k := keyOf(req)
	if err := k.Validate(); err != nil {
		return errResp(errorOf(err))
	}
	ls, ok := s.cfg.Ledger.Lease(k)
	if !ok {
		return errResp(&api.Error{Code: api.CodeNotFound, Msg: fmt.Sprintf("attachment %s holds no lease", k)})
	}
	if len(req.IPs) > 0 {
		want := map[netip.Addr]bool{}
		for _, p := range ls.IPs {
			want[p.Addr()] = true
		}
		for _, s := range req.IPs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				a, aerr := netip.ParseAddr(s)
				if aerr != nil {
					return errResp(&api.Error{Code: api.CodeInvalid, Msg: fmt.Sprintf("prevResult.ips: %q is not an address", s)})
				}
				p = netip.PrefixFrom(a, a.BitLen())
			}
			if !want[p.Addr()] {
				return errResp(&api.Error{Code: api.CodeMismatch, Msg: fmt.Sprintf("attachment %s: address %s is not leased to it (it holds %v)", k, p.Addr(), ls.IPs)})
			}
			delete(want, p.Addr())
		}
		if len(want) > 0 {
			return errResp(&api.Error{Code: api.CodeMismatch, Msg: fmt.Sprintf("attachment %s holds %v, prevResult lacks some of them", k, ls.IPs)})
		}
	}
	if req.NetNS.Ino != 0 && ls.NetNS.Ino != 0 && (req.NetNS.Ino != ls.NetNS.Ino || req.NetNS.Dev != ls.NetNS.Dev) {
		return errResp(&api.Error{Code: api.CodeMismatch, Msg: fmt.Sprintf("attachment %s: CNI_NETNS %s is namespace %d:%d, the lease was made for %d:%d", k, req.NetNS.Path, req.NetNS.Dev, req.NetNS.Ino, ls.NetNS.Dev, ls.NetNS.Ino)})
	}
	v := s.view(ls)
	return &api.Response{Lease: &v}
}

func (s *Server) gc(ctx context.Context, req api.Request) *api.Response {
	if req.Network == "" {
		return errResp(&api.Error{Code: api.CodeInvalid, Msg: "name: the network name is required for GC"})
	}
	valid := map[ledger.Key]bool{}
	for _, a := range req.Valid {
		valid[ledger.Key{Network: req.Network, ContainerID: a.ContainerID, IfName: a.IfName}] = true
	}
	var drop []ledger.Lease
	for _, ls := range s.cfg.Ledger.Leases(req.Network) {
		if valid[ls.Key] {
			continue
		}
		if s.cfg.Guard != nil && !s.cfg.Guard.MayRelease(ctx, ls) {
			s.log.Warn("GC keeps a lease the runtime says is in use or cannot vouch for", "attachment", ls.Key.String())
			continue
		}
		drop = append(drop, ls)
	}
	// Lock each attachment so a concurrent ADD or DEL of it is not interleaved, and
	// release only the holder that was judged: not one the attachment got since.
	// A failed release does not stop the others: the CNI spec asks GC to collect as
	// much as it can and report every failure.
	var released int
	var failed []error
	for _, ls := range drop {
		unlock := s.locks.lock(ls.Key)
		rel, ok, err := s.cfg.Ledger.ReleaseIfCreated(ls.Key, ls.Created, ledger.ReasonGC, "not in cni.dev/valid-attachments")
		unlock()
		if err != nil {
			failed = append(failed, fmt.Errorf("%s: %w", ls.Key, err))
			continue
		}
		if ok {
			released++
			s.returnBorrowed(ctx, rel)
		}
	}
	resp := &api.Response{Released: released}
	if len(failed) > 0 {
		resp.Error = gcError(released, failed)
	}
	return resp
}

// gcError reports every failed release of a GC (the first few in full).
func gcError(released int, failed []error) *api.Error {
	const shown = 8
	e := errorOf(failed[0])
	msg := fmt.Sprintf("GC released %d leases and failed to release %d:", released, len(failed))
	for i, err := range failed {
		if i == shown {
			msg += fmt.Sprintf(" ... and %d more", len(failed)-shown)
			break
		}
		msg += " [" + err.Error() + "]"
	}
	e.Msg = msg
	return e
}

func (s *Server) status(req api.Request) *api.Response {
	if aerr := s.networkGate(); aerr != nil {
		return errResp(aerr)
	}
	if _, aerr := s.resolveRanges(req.Ranges); aerr != nil {
		return errResp(aerr)
	}
	if s.cfg.Cluster != nil {
		return s.clusterStatus(req)
	}
	if req.Network == "" {
		return &api.Response{}
	}
	ps, err := s.cfg.Ledger.Pool(req.Network)
	if errors.Is(err, ledger.ErrUnknownNetwork) {
		return &api.Response{}
	}
	if err != nil {
		return errResp(errorOf(err))
	}
	pv := ledgerview.Pool(ps)
	if !ps.Available {
		return &api.Response{Pool: &pv, Error: &api.Error{Code: api.CodeExhausted, Msg: fmt.Sprintf("network %q: no address can be allocated now (%d in use, %d waiting out the reuse delay)", req.Network, ps.InUse, ps.Free)}}
	}
	return &api.Response{Pool: &pv}
}

func (s *Server) leases(req api.Request) *api.Response {
	views := []api.LeaseView{}
	for _, ls := range s.cfg.Ledger.Leases(req.Network) {
		views = append(views, s.view(ls))
	}
	return &api.Response{Leases: views}
}

func (s *Server) audit() *api.Response {
	rep, err := s.cfg.Ledger.Audit()
	if err != nil {
		return errResp(errorOf(err))
	}
	a := &api.Audit{Live: rep.Live, DoubleAssigned: len(rep.DoubleAssigned), Doubles: ledgerview.Doubles(rep.DoubleAssigned), Problems: rep.Problems, Pools: ledgerview.Pools(rep.Pools), Runtime: "none"}
	s.summarize(a)
	if s.cfg.Cluster != nil {
		s.fillDraining(a.Pools)
	}
	a.OK = rep.OK && a.Leaked == 0
	return &api.Response{Audit: a}
}

func (s *Server) history(req api.Request) *api.Response {
	ip, err := netip.ParseAddr(req.IP)
	if err != nil {
		return errResp(&api.Error{Code: api.CodeInvalid, Msg: fmt.Sprintf("ip: %q is not an IP address", req.IP)})
	}
	h, err := s.cfg.Ledger.History(req.Network, ip)
	if err != nil {
		return errResp(errorOf(err))
	}
	if h == nil {
		h = []ledger.Release{}
	}
	return &api.Response{History: ledgerview.Releases(h)}
}

func (s *Server) release(ctx context.Context, req api.Request) *api.Response {
	k := keyOf(req)
	if err := k.Validate(); err != nil {
		return errResp(errorOf(err))
	}
	if e := s.releaseAllowed(ctx, req); e != nil {
		return errResp(e)
	}
	unlock := s.locks.lock(k)
	defer unlock()
	detail := req.Detail
	if detail == "" {
		detail = "released by an operator"
	}
	rel, ok, err := s.cfg.Ledger.Release(k, ledger.ReasonManual, detail)
	if err != nil {
		return errResp(errorOf(err))
	}
	if !ok {
		return errResp(&api.Error{Code: api.CodeNotFound, Msg: fmt.Sprintf("attachment %s holds no lease", k)})
	}
	s.returnBorrowed(ctx, rel)
	return &api.Response{Released: 1}
}
