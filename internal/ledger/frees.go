package ledger

import "time"

// FreeAddresses returns the released addresses of network waiting to be reused (each
// with its release time), in no particular order; nil for an unknown network. It reads
// the in-memory index only (operator views: metrics, the pool page).
func (l *Ledger) FreeAddresses(network string) []Free {
	l.mu.Lock()
	defer l.mu.Unlock()
	ps := l.pools[network]
	if ps == nil {
		return nil
	}
	var out []Free
	for _, s := range ps.sets {
		for _, it := range s.index {
			out = append(out, it.f)
		}
	}
	return out
}

// ReuseDelay is the least time between an address's release and its allocation to
// another pod.
func (l *Ledger) ReuseDelay() time.Duration { return l.opts.ReuseDelay }
