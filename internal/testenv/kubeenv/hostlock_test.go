package kubeenv

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestHostLockKeptUntilExit: once a process's cluster has taken the host-wide
// lock, another process cannot take it between that cluster's end and the
// process's next cluster (so packages run side by side take turns as wholes,
// not test by test), and the process's next cluster does not wait for itself.
func TestHostLockKeptUntilExit(t *testing.T) {
	if hostLockState.held != nil {
		t.Fatal("this test must run before any cluster of the process")
	}
	p := filepath.Join(t.TempDir(), ".cluster.lock")
	was := hostLockPath
	hostLockPath = func() string { return p }
	t.Cleanup(func() {
		hostLockPath = was
		if hostLockState.held != nil {
			hostLockState.held.Close() // drops the flock: the real path is taken afresh
			hostLockState.held = nil
		}
	})
	// other is another process's attempt: a separate open file description,
	// which flock(2) treats as a separate holder.
	other := func() error {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	}

	release := hostLock(t) // the first cluster starts
	if err := other(); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Fatalf("another process took the lock while a cluster ran: %v", err)
	}
	release() // the first cluster ended
	if err := other(); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Fatalf("another process took the lock between this process's clusters (%v): side by side, two packages would take turns test by test", err)
	}
	second := make(chan func())
	go func() { second <- hostLock(t) }()
	select {
	case release := <-second:
		release()
	case <-time.After(time.Minute):
		t.Fatal("the process's second cluster waited for the lock the process holds")
	}
}
