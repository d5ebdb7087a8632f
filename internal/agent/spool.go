package agent

import (
	"errors"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledgerview"
	"github.com/ipledger/ipledger/internal/spool"
)

// Ordering spooled DELs against ADDs, without clocks.
//
// A spooled DEL names an attachment, not a lease, and the plugin's wall clock says
// nothing reliable about when it was written relative to the ledger's leases (clocks
// step). The order comes from the attachment's lock instead:
//
//   - Every request that can hand the attachment a lease (ADD) first takes the
//     attachment's lock and applies its pending entry, if any (settleSpooled), before
//     it allocates; the entry's removal is durable before the ADD answers.
//   - Every spool pass takes the attachment's lock per entry and re-reads the entry
//     under it.
//
// A runtime sends an attachment's DEL and its next ADD one after the other, and the
// plugin answers a spooled DEL only after the entry is in place. So a DEL answered
// before an ADD was sent is applied by that ADD, before it allocates. Any entry a
// later pass finds was therefore written after the last ADD of its attachment started:
// it refers to the lease that ADD made (the runtime tore that attachment down, maybe
// after giving up on the ADD) or to nothing, and releasing the attachment's current
// lease is right in both cases. No timestamp is compared; an entry that matches no
// lease is logged and counted (CounterSpoolUnmatched).

// settleSpooled applies the pending spooled DEL of k, if any. The caller holds k's
// lock. It fails only when the entry could not be applied (the store failed); an entry
// rejected as untrustworthy is logged, counted and moved aside, and does not fail it.
// The ledger's log line of the release goes to later (nil: written at once).
func (s *Server) settleSpooled(k ledger.Key, later *ledger.LogLines) error {
	if s.spool == nil {
		return nil
	}
	applied, err := s.spool.Take(ledgerview.Key(k), func(e spool.Entry) error {
		detail := "spooled DEL (plugin clock " + e.Spooled.Format(time.RFC3339) + ")"
		_, ok, err := s.cfg.Ledger.ReleaseLogLater(k, ledger.ReasonDEL, detail, later)
		if err != nil {
			return err
		}
		if ok {
			s.stats.Released(ledger.ReasonDEL, 1)
		}
		if !ok {
			s.log.Warn("spooled DEL matched no lease (released since, or never allocated)", "attachment", k.String(), "spooled", e.Spooled)
			s.stats.add(CounterSpoolUnmatched, 1)
		}
		return nil
	})
	if applied {
		s.log.Info("applied a spooled DEL", "attachment", k.String())
		s.stats.add(CounterSpoolApplied, 1)
	}
	if errors.Is(err, spool.ErrRejected) {
		s.log.Error("DEL spool", "err", err)
		s.stats.add(CounterSpoolRejected, 1)
		s.countRejectedDropped()
		return nil
	}
	return err
}

// countRejectedDropped counts and logs the rejected entries the spool removed to keep
// its rejected/ directory within spool.MaxRejected.
func (s *Server) countRejectedDropped() {
	if n := s.spool.TakeDropped(); n > 0 {
		s.stats.add(CounterSpoolRejectedDropped, n)
		s.log.Warn("DEL spool: removed the oldest rejected entries", "removed", n, "keep", spool.MaxRejected, "dir", s.spool.Path()+"/rejected")
	}
}

// ApplySpool applies every spooled DEL, each under its attachment's lock, and tidies
// the spool (bad entries moved aside, stale temporary files removed). Serve calls it
// before its first Accept, periodically, and after draining.
func (s *Server) ApplySpool() {
	if s.spool == nil {
		return
	}
	keys, err := s.spool.Pending()
	if err != nil {
		s.log.Error("DEL spool", "err", err)
		s.stats.add(CounterSpoolRejected, countRejected(err))
		s.countRejectedDropped()
	}
	for _, sk := range keys {
		k := ledgerKey(sk)
		unlock := s.locks.lock(k)
		err := s.settleSpooled(k, nil)
		unlock()
		if err != nil {
			s.log.Error("DEL spool: entry kept for the next pass", "attachment", k.String(), "err", err)
		}
	}
}

func countRejected(err error) int {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		n := 0
		for _, e := range j.Unwrap() {
			if errors.Is(e, spool.ErrRejected) {
				n++
			}
		}
		return n
	}
	if errors.Is(err, spool.ErrRejected) {
		return 1
	}
	return 0
}
