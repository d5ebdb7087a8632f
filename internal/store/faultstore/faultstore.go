// Package faultstore wraps a ledger.Store and makes chosen commits fail at a chosen
// step, so that tests can show what the ledger does after each way a real commit
// fails: nothing written, written but not durable, or durable while the caller is
// told it failed (bbolt's fdatasync failing after the meta page was written).
//
// It is a test tool that lives beside the real stores; wrapped around boltstore it
// exercises the real file and bbolt's own rollback.
package faultstore

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/ipledger/ipledger/internal/ledger"
)

// Step is where a commit fails.
type Step int

// The steps of a commit at which a fault can be injected.
const (
	// None: the commit goes through.
	None Step = iota
	// BeforeWrite: Update fails before the transaction runs; nothing is written.
	BeforeWrite
	// DuringWrite: one of the transaction's writes (the first to the fourth Put or
	// Delete, in turn) fails; the transaction is aborted and nothing is stored.
	DuringWrite
	// AfterWrite: every write of the transaction was made, then the commit fails
	// before it is durable (a data-page write or fsync failing); nothing is stored.
	AfterWrite
	// AfterSync: the transaction is committed and durable, yet Update returns an
	// error (fsync reported a failure after the meta page reached the file). The
	// store holds the change although the caller was told it failed.
	AfterSync
	numSteps
)

func (s Step) String() string {
	switch s {
	case None:
		return "none"
	case BeforeWrite:
		return "before-write"
	case DuringWrite:
		return "during-write"
	case AfterWrite:
		return "after-write"
	case AfterSync:
		return "after-sync"
	}
	return fmt.Sprintf("step(%d)", int(s))
}

// Steps lists the steps that inject a fault.
func Steps() []Step { return []Step{BeforeWrite, DuringWrite, AfterWrite, AfterSync} }

// ErrInjected is wrapped by every injected failure (together with ledger.ErrStore).
var ErrInjected = errors.New("injected store fault")

// Store is a ledger.Store that fails the commits its chooser picks.
type Store struct {
	inner ledger.Store

	mu       sync.Mutex
	choose   func() Step
	counts   [numSteps]int
	commits  int
	hold     chan struct{} // when set, Update waits on it before running (tests queue operations behind it)
	entering chan struct{}
}

var _ ledger.Store = (*Store)(nil)

// New wraps inner. choose is called once per Update and says where that commit
// fails (None: it does not); nil never injects.
func New(inner ledger.Store, choose func() Step) *Store {
	if choose == nil {
		choose = func() Step { return None }
	}
	return &Store{inner: inner, choose: choose}
}

// Inner is the wrapped store (to open a second ledger on the same state).
func (s *Store) Inner() ledger.Store { return s.inner }

// SetChooser replaces the chooser.
func (s *Store) SetChooser(choose func() Step) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if choose == nil {
		choose = func() Step { return None }
	}
	s.choose = choose
}

// FailNext makes the next commit fail at step, and later ones go through.
func (s *Store) FailNext(step Step) {
	var once sync.Once
	s.SetChooser(func() Step {
		out := None
		once.Do(func() { out = step })
		return out
	})
}

// Hold makes every Update wait until the returned release function is called; the
// returned channel receives once for each Update that starts waiting. Tests use it to
// queue several operations behind one commit, so that they share the next one.
func (s *Store) Hold() (entered <-chan struct{}, release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := make(chan struct{})
	e := make(chan struct{}, 64)
	s.hold, s.entering = h, e
	var once sync.Once
	return e, func() {
		once.Do(func() {
			s.mu.Lock()
			s.hold, s.entering = nil, nil
			s.mu.Unlock()
			close(h)
		})
	}
}

// Counts returns how many commits were attempted and how many faults were injected
// at each step.
func (s *Store) Counts() (commits int, faults map[Step]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	faults = map[Step]int{}
	for _, st := range Steps() {
		faults[st] = s.counts[st]
	}
	return s.commits, faults
}

func injected(step Step) error {
	return fmt.Errorf("%w: %w at %s", ledger.ErrStore, ErrInjected, step)
}

// Update implements ledger.Store, failing where the chooser says.
func (s *Store) Update(fn func(ledger.Tx) error) error {
	s.mu.Lock()
	hold, entering := s.hold, s.entering
	s.mu.Unlock()
	if hold != nil {
		select {
		case entering <- struct{}{}:
		default:
		}
		<-hold
	}
	s.mu.Lock()
	step := s.choose()
	skip := s.commits % 4
	s.commits++
	s.counts[step]++
	s.mu.Unlock()
	switch step {
	case BeforeWrite:
		return injected(step)
	case DuringWrite:
		return s.inner.Update(func(tx ledger.Tx) error {
			if err := fn(&failingTx{Tx: tx, skip: skip}); err != nil {
				return err
			}
			// fewer writes than skip: abort all the same, the commit failed
			return injected(step)
		})
	case AfterWrite:
		return s.inner.Update(func(tx ledger.Tx) error {
			if err := fn(tx); err != nil {
				return err
			}
			return injected(step)
		})
	case AfterSync:
		if err := s.inner.Update(fn); err != nil {
			return err
		}
		return injected(step)
	}
	return s.inner.Update(fn)
}

// View implements ledger.Store.
func (s *Store) View(fn func(ledger.ReadTx) error) error { return s.inner.View(fn) }

// Close implements ledger.Store.
func (s *Store) Close() error { return s.inner.Close() }

// failingTx lets skip writes through and fails the next one.
type failingTx struct {
	ledger.Tx
	skip int
}

// fail reports whether this write fails.
func (t *failingTx) fail() bool {
	if t.skip > 0 {
		t.skip--
		return false
	}
	return true
}

func (t *failingTx) PutPool(p ledger.PoolRecord) error {
	if t.fail() {
		return injected(DuringWrite)
	}
	return t.Tx.PutPool(p)
}
func (t *failingTx) PutLease(l ledger.Lease) error {
	if t.fail() {
		return injected(DuringWrite)
	}
	return t.Tx.PutLease(l)
}
func (t *failingTx) DeleteLease(k ledger.Key) error {
	if t.fail() {
		return injected(DuringWrite)
	}
	return t.Tx.DeleteLease(k)
}
func (t *failingTx) PutFree(f ledger.Free) error {
	if t.fail() {
		return injected(DuringWrite)
	}
	return t.Tx.PutFree(f)
}
func (t *failingTx) DeleteFree(network string, ip netip.Addr) error {
	if t.fail() {
		return injected(DuringWrite)
	}
	return t.Tx.DeleteFree(network, ip)
}
func (t *failingTx) AppendHistory(r ledger.Release, keep int) error {
	if t.fail() {
		return injected(DuringWrite)
	}
	return t.Tx.AppendHistory(r, keep)
}
func (t *failingTx) PutBlock(b ledger.BlockRecord) error {
	if t.fail() {
		return injected(DuringWrite)
	}
	return t.Tx.PutBlock(b)
}
func (t *failingTx) DeleteBlock(network string, prefix netip.Prefix) error {
	if t.fail() {
		return injected(DuringWrite)
	}
	return t.Tx.DeleteBlock(network, prefix)
}
