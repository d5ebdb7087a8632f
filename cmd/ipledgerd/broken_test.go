package main

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/memstore"
)

// unreadable fails every commit, and every read once broken is set: a disk that
// failed mid-commit and then cannot be read back.
type unreadable struct {
	ledger.Store
	broken atomic.Bool
}

var errDisk = errors.New("injected: disk gone")

func (u *unreadable) Update(fn func(ledger.Tx) error) error {
	if u.broken.Load() {
		return errDisk
	}
	return u.Store.Update(fn)
}

func (u *unreadable) View(fn func(ledger.ReadTx) error) error {
	if u.broken.Load() {
		return errDisk
	}
	return u.Store.View(fn)
}

// When a commit fails and the books cannot be read back, the agent stops (its
// supervisor restarts it on the stored books) instead of serving a guess.
func TestAgentStopsWhenLedgerStateUnknown(t *testing.T) {
	st := &unreadable{Store: memstore.New()}
	l, err := ledger.Open(st, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancelCause(context.Background())
	defer stop(nil)
	go watchLedger(ctx, l, stop)

	st.broken.Store(true)
	_, _, err = l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key("c1"), Ranges: ledgertest.Ranges(t, `[[{"subnet":"10.251.0.0/24"}]]`)})
	if err == nil {
		t.Fatal("ADD succeeded on a store that fails every commit")
	}
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the agent kept serving a ledger whose state is unknown")
	}
	if cause := context.Cause(ctx); !errors.Is(cause, ledger.ErrStateUnknown) {
		t.Fatalf("stopped with %v, want ledger.ErrStateUnknown", cause)
	}
}
