package ledger

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// change collects the writes of one transaction and the in-memory steps to undo if
// the commit fails. Several operations share one change when their requests arrive
// together (group commit); each operation's part can be undone on its own.
type change struct {
	l       *Ledger
	writes  []func(Tx) error
	undo    []func()
	after   []func(at time.Time) // run once the change is durable, at (log lines)
	pools   map[*poolState]bool
	opPools map[*poolState]bool // pools whose record the current operation saved
	// blocks whose record is written at commit (after the writes: a block removed
	// and added again within the change is a new blockState)
	blocks   map[*blockState]bool
	opBlocks map[*blockState]bool
}

func (l *Ledger) begin() *change {
	return &change{l: l, pools: map[*poolState]bool{}, opPools: map[*poolState]bool{}, blocks: map[*blockState]bool{}, opBlocks: map[*blockState]bool{}}
}

func (c *change) write(fn func(Tx) error)        { c.writes = append(c.writes, fn) }
func (c *change) onUndo(fn func())               { c.undo = append(c.undo, fn) }
func (c *change) onCommit(fn func(at time.Time)) { c.after = append(c.after, fn) }

type mark struct{ w, u, a int }

// mark starts an operation within the change.
func (c *change) mark() mark {
	c.opPools = map[*poolState]bool{}
	c.opBlocks = map[*blockState]bool{}
	return mark{len(c.writes), len(c.undo), len(c.after)}
}

// rollbackTo undoes the operation begun at m, leaving earlier ones in place.
func (c *change) rollbackTo(m mark) {
	for i := len(c.undo) - 1; i >= m.u; i-- {
		c.undo[i]()
	}
	c.undo, c.writes, c.after = c.undo[:m.u], c.writes[:m.w], c.after[:m.a]
}

// touchPool marks a pool record to be written at commit, remembering its value
// before the current operation.
func (c *change) touchPool(ps *poolState) {
	if c.opPools[ps] {
		return
	}
	c.opPools[ps] = true
	old := ps.rec
	old.NextFresh = append([]uint64(nil), ps.rec.NextFresh...)
	c.onUndo(func() { ps.rec = old })
	if !c.pools[ps] {
		c.pools[ps] = true
		c.onUndo(func() { delete(c.pools, ps) })
	}
}

// commit writes the change in one durable transaction. When the commit fails the
// books are re-read from the store (see reread), not undone step by step.
func (c *change) commit() error {
	if len(c.writes) == 0 && len(c.pools) == 0 && len(c.blocks) == 0 {
		return nil
	}
	err := c.l.st.Update(func(tx Tx) error {
		for ps := range c.pools {
			if err := tx.PutPool(ps.rec); err != nil {
				return err
			}
		}
		for _, w := range c.writes {
			if err := w(tx); err != nil {
				return err
			}
		}
		for b := range c.blocks {
			if !b.removed {
				if err := tx.PutBlock(b.rec); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		c.l.reread(err)
		return err
	}
	return nil
}

// opReq is one state change waiting for its commit.
type opReq struct {
	op    func(c *change) error
	err   error
	after []func(at time.Time) // its log lines, once its change is durable (at)
	lead  bool
	done  chan struct{}
}

// LogLines holds the log lines of changes that a caller chose to write later
// (AllocateRequest.LogLater, ReleaseLogLater): the agent writes them once it has
// answered, so that a request's answer never waits for its log line. The changes are
// durable before the call returns either way; a line is a report of the change, not
// its record. The zero value is empty. It is not safe for concurrent use.
type LogLines struct{ fns []func() }

// Write writes the lines held and forgets them.
func (ll *LogLines) Write() {
	fns := ll.fns
	ll.fns = nil
	for _, fn := range fns {
		fn()
	}
}

// deliver hands the log lines of a change durable at at to later, or writes them when
// later is nil. A line keeps at as its time whenever it is written (logAt).
func deliver(fns []func(at time.Time), at time.Time, later *LogLines) {
	for _, fn := range fns {
		if later != nil {
			later.fns = append(later.fns, func() { fn(at) })
		} else {
			fn(at)
		}
	}
}

// logAt writes a log line stamped at, the time its change became durable rather than
// the time it is written: the agent writes a request's lines after its answer, so the
// lines of two requests in a row may be written in either order, and their times
// still tell which change came first.
func (l *Ledger) logAt(at time.Time, level slog.Level, msg string, args ...any) {
	ctx := context.Background()
	if !l.log.Enabled(ctx, level) {
		return
	}
	r := slog.NewRecord(at, level, msg, 0)
	r.Add(args...)
	_ = l.log.Handler().Handle(ctx, r) // as slog.Logger does: a handler's error goes nowhere
}

// do applies op to the ledger and returns once its change is durable (or has failed
// and been undone). Concurrent calls are committed together: the first caller leads,
// applies every operation queued so far in one transaction with one fsync, answers
// them all, and hands the lead to the next waiting caller. Each operation sees the
// effects of those before it; one that fails is undone alone.
//
// The operation's log lines (change.onCommit) are written by its own caller once the
// batch's callers have been answered, outside the ledger's lock: by do before it
// returns, or through later (doLater).
func (l *Ledger) do(op func(c *change) error) error { return l.doLater(op, nil) }

// doLater is do, handing the operation's log lines to later (nil: written before it
// returns).
func (l *Ledger) doLater(op func(c *change) error, later *LogLines) error {
	r := &opReq{op: op, done: make(chan struct{})}
	l.qmu.Lock()
	l.queue = append(l.queue, r)
	lead := !l.leading
	l.leading = true
	l.qmu.Unlock()
	if !lead {
		<-r.done
		if !r.lead {
			if r.err == nil {
				deliver(r.after, l.opts.Clock.Now(), later)
			}
			return r.err
		}
	}
	l.qmu.Lock()
	batch := l.queue
	l.queue = nil
	l.qmu.Unlock()

	l.mu.Lock()
	err := l.broken
	if err == nil {
		c := l.begin()
		for _, q := range batch {
			m := c.mark()
			if err := q.op(c); err != nil {
				c.rollbackTo(m)
				q.err = err
			}
			// capped: a later operation's lines never write over this one's
			q.after = c.after[m.a:len(c.after):len(c.after)]
		}
		err = c.commit()
	}
	l.mu.Unlock()

	for _, q := range batch {
		if err != nil && q.err == nil {
			q.err = err
		}
		if q != r {
			close(q.done)
		}
	}
	l.qmu.Lock()
	if len(l.queue) > 0 {
		next := l.queue[0]
		next.lead = true
		close(next.done)
	} else {
		l.leading = false
	}
	l.qmu.Unlock()
	if r.err == nil {
		deliver(r.after, l.opts.Clock.Now(), later)
	}
	return r.err
}

// reread replaces the in-memory books with the store's after a failed commit.
//
// Why re-read rather than undo or stop: a failed commit does not say how far it got.
// bbolt can fail its fdatasync after the meta page reached the file; the change is
// then what every later transaction builds on, although the caller was told it
// failed. Undoing it in memory would let the next ADD hand out an address the store
// still records as held (a second lease for it, and a file the next start refuses).
// The store's own view is the one truth both sides can agree on, and bbolt (1.4+)
// rebuilds its free-page list from that same view when a commit fails, so the re-read
// matches what the next transaction writes over. Re-reading keeps the agent serving
// (a full disk is usually transient, and DELs must keep working once it is not)
// where stopping would crash-loop it for as long as the disk stays full. Only when
// the re-read itself fails does the ledger refuse every change (ErrStateUnknown), so
// that the agent exits and its supervisor restarts it into a fresh Open.
func (l *Ledger) reread(cause error) {
	keep := map[freeMark]time.Duration{}
	for n, ps := range l.pools {
		for _, s := range ps.sets {
			for ip, it := range s.index {
				keep[freeMark{n, ip, it.f.Seq}] = it.mono
			}
		}
	}
	if err := l.load(keep); err != nil {
		if l.broken == nil {
			close(l.brokenC)
		}
		l.broken = fmt.Errorf("%w: %w: a commit failed (%v) and the books could not be read back from the store (%v); restart ipledgerd", ErrStateUnknown, ErrStore, cause, err)
		l.log.Error("ledger refuses changes until restarted", "err", l.broken)
		return
	}
	l.log.Warn("commit failed; books re-read from the store", "err", cause)
}

// Broken returns the error every change fails with once the ledger could not re-read
// its books after a failed commit (wrapping ErrStateUnknown), or nil. The agent
// exits on it so that its supervisor restarts it.
func (l *Ledger) Broken() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.broken
}

// BrokenC is closed when Broken starts returning an error, for the agent to wait
// on rather than ask Broken again and again.
func (l *Ledger) BrokenC() <-chan struct{} { return l.brokenC }
