package ledger

import (
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"time"
)

// SetWithheld makes addrs exactly the addresses of the node's block prefix that it
// does not hand out: addresses another node borrowed from the block (a StatefulSet
// pod's sticky address, re-created there) or kept for such a pod. A withheld
// address that is free leaves the free list; one released while withheld is not
// kept free; one no longer withheld that no lease holds is free again (released
// now: the reuse delay counts from here). A lease that holds a withheld address
// keeps it. The block is not removed while it withholds an address
// (ErrBlockInUse). The set lives in memory: the block manager sets it from the
// block's datastore record before it resumes the block after a restart.
func (l *Ledger) SetWithheld(network string, prefix netip.Prefix, addrs []netip.Addr) error {
	return l.do(func(c *change) error { return l.setWithheld(c, network, prefix, addrs) })
}

func (l *Ledger) setWithheld(c *change, network string, prefix netip.Prefix, addrs []netip.Addr) error {
	{
		ps, i, b, err := l.heldClusterBlock(network, prefix)
		if err != nil {
			return err
		}
		s := ps.sets[i]
		want := make(map[netip.Addr]bool, len(addrs))
		for _, a := range addrs {
			if !prefix.Contains(a) {
				return fmt.Errorf("%w: address %s is not in block %s of %q", ErrUnknownBlock, a, prefix, network)
			}
			want[a] = true
		}
		old := b.withheld
		c.onUndo(func() { b.withheld = old })
		now := l.opts.Clock.Now().UTC()
		mono := l.opts.Clock.Mono()
		for _, a := range sortedAddrs(want) {
			if old[a] {
				continue
			}
			if it := s.index[a]; it != nil {
				c.takeFree(s, it)
			}
		}
		for _, a := range sortedAddrs(old) {
			if want[a] || ps.held[a] != nil || s.index[a] != nil || b.rec.State == BlockLost {
				continue
			}
			c.touchPool(ps)
			// free again as of its last release, which the history holds (the
			// books tie each free record to it); the reuse delay counts from now
			f := Free{Network: network, IP: a, Set: i}
			if last, ok, err := l.lastRelease(network, a); err != nil {
				return err
			} else if ok {
				f.ReleasedAt, f.Seq, f.LastUID = last.To, last.Seq, last.Pod.UID
			} else {
				ps.rec.Seq++
				f.ReleasedAt, f.Seq = now, ps.rec.Seq
			}
			s.addFree(f, mono)
			c.onUndo(func() { s.removeFree(s.index[a]) })
			c.write(func(tx Tx) error { return tx.PutFree(f) })
		}
		if len(want) == 0 {
			want = nil
		}
		b.withheld = want
		if !maps.Equal(old, want) {
			c.onCommit(func(at time.Time) {
				l.logAt(at, slog.LevelInfo, "block's withheld addresses set", "network", network, "block", prefix.String(), "withheld", fmt.Sprint(sortedAddrs(want)))
			})
		}
		return nil
	}
}

// Withheld returns the addresses of the node's block prefix that SetWithheld
// withholds, in address order.
func (l *Ledger) Withheld(network string, prefix netip.Prefix) []netip.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _, b, err := l.clusterBlock(network, prefix)
	if err != nil || b == nil {
		return nil
	}
	return sortedAddrs(b.withheld)
}

func sortedAddrs(m map[netip.Addr]bool) []netip.Addr {
	return slices.SortedFunc(maps.Keys(m), netip.Addr.Compare)
}

// lastRelease is the last release of a in network's history, if any.
func (l *Ledger) lastRelease(network string, a netip.Addr) (Release, bool, error) {
	var h []Release
	err := l.st.View(func(tx ReadTx) error {
		var err error
		h, err = tx.History(network, a)
		return err
	})
	if err != nil || len(h) == 0 {
		return Release{}, false, err
	}
	return h[len(h)-1], true, nil
}
