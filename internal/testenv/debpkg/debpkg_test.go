package debpkg

import (
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestEnsureWaitsForAnotherInstaller: while someone else holds the lock (another
// test process, or scripts/install-deps.sh around apt-get), Ensure neither checks nor
// installs; it goes on once the lock is released, and finds the packages there.
func TestEnsureWaitsForAnotherInstaller(t *testing.T) {
	Need(t, IPRoute2) // the lock file exists and the package is there
	// flock(2) locks belong to an open file description: this one stands for another
	// process's.
	f, err := os.OpenFile(LockFile, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Ensure(IPRoute2, CNIPlugins) }()
	select {
	case err := <-done:
		t.Fatalf("Ensure returned (%v) while another holder had %s", err, LockFile)
	case <-time.After(500 * time.Millisecond):
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Ensure did not go on after the lock was released")
	}
}
