package netenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where named namespaces are bind-mounted (as by `ip netns add`).
const netnsDir = "/run/netns"

// Create is the one fixture of a named network namespace: it makes
// /run/netns/name (as `ip netns add` does) and removes it in tb.Cleanup, where
// a failed removal fails the test. It returns the namespace and an open handle
// of it, which the caller closes in a cleanup it registers after this call (so
// that it runs before the removal).
func Create(tb testing.TB, name string) (NS, netns.NsHandle) {
	tb.Helper()
	h, err := createNamed(name)
	if err != nil {
		tb.Fatalf("netenv: namespace %s: %v", name, err)
	}
	tb.Cleanup(func() {
		if err := Remove(name); err != nil {
			tb.Errorf("netenv: remove namespace %s: %v", name, err)
		}
	})
	return NS{Name: name, Path: filepath.Join(netnsDir, name)}, h
}

// createNamed creates the network namespace name under /run/netns and returns
// an open handle of it; the calling thread's namespace is left alone.
func createNamed(name string) (netns.NsHandle, error) {
	type result struct {
		h   netns.NsHandle
		err error
	}
	rc := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			rc <- result{netns.None(), err}
			return
		}
		defer orig.Close()
		h, err := netns.NewNamed(name) // moves this thread into the new namespace
		if rerr := netns.Set(orig); rerr != nil {
			if h.IsOpen() {
				h.Close()
			}
			rc <- result{netns.None(), errors.Join(err, rerr)} // thread stays locked and dies
			return
		}
		runtime.UnlockOSThread()
		rc <- result{h, err}
	}()
	r := <-rc
	return r.h, r.err
}

// Remove unmounts and removes /run/netns/name (as `ip netns del` does); already
// gone is success. For sweeping a namespace whose test is gone; a test's own
// namespaces are removed by Create's cleanup.
func Remove(name string) error {
	p := filepath.Join(netnsDir, name)
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmount %s: %w", p, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
