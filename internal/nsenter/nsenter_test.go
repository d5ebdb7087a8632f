package nsenter

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// fakeThread counts Setns and Unlock calls; Setns call number failAt fails.
type fakeThread struct {
	setns, unlocks atomic.Int32
	failAt         int32
}

func (f *fakeThread) thread() Thread {
	return Thread{
		Setns: func(int) error {
			if f.setns.Add(1) == f.failAt {
				return unix.EPERM
			}
			return nil
		},
		Unlock: func() { f.unlocks.Add(1) },
	}
}

// TestThreadNotBackStaysLocked: when the way back into the thread's own namespace
// fails after fn ran, the thread is never unlocked (Go retires it with its
// goroutine) and the error says so; when entering fails, nothing changed and the
// thread is released; when both succeed, it is released once.
func TestThreadNotBackStaysLocked(t *testing.T) {
	for _, c := range []struct {
		name        string
		failAt      int32
		ran         bool
		unlocks     int32
		notBack, ok bool
	}{
		{"way back fails", 2, true, 0, true, false},
		{"enter fails", 1, false, 1, false, false},
		{"both succeed", 0, true, 1, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeThread{failAt: c.failAt}
			ran := false
			err := f.thread().Do(-1, func() error { ran = true; return nil })
			if ran != c.ran || f.unlocks.Load() != c.unlocks || errors.Is(err, ErrNotBack) != c.notBack || (err == nil) != c.ok {
				t.Fatalf("ran %v, unlocks %d, err %v; want ran %v, unlocks %d, not back %v, ok %v", ran, f.unlocks.Load(), err, c.ran, c.unlocks, c.notBack, c.ok)
			}
		})
	}
	// fn's own error is kept beside the thread's
	f := &fakeThread{failAt: 2}
	fnErr := errors.New("netlink call failed")
	if err := f.thread().Do(-1, func() error { return fnErr }); !errors.Is(err, fnErr) || !errors.Is(err, ErrNotBack) || f.unlocks.Load() != 0 {
		t.Fatalf("err %v, unlocks %d", err, f.unlocks.Load())
	}
	// a handle whose thread could not come back is not handed out
	f = &fakeThread{failAt: 2}
	if h, err := f.thread().Handle(-1, unix.NETLINK_ROUTE); h != nil || !errors.Is(err, ErrNotBack) || f.unlocks.Load() != 0 {
		t.Fatalf("Handle = %v, %v, unlocks %d", h, err, f.unlocks.Load())
	}
}

// TestHandleInNamespace: a handle opened with the real setns sees the namespace's
// links, not the host's, and the caller's thread stays in its namespace.
func TestHandleInNamespace(t *testing.T) {
	ns := netenv.Namespace(t, "iplnse")
	const link = "nsenter0"
	if out, err := exec.Command("ip", "-n", ns.Name, "link", "add", link, "type", "veth", "peer", "name", "nsenter1").CombinedOutput(); err != nil {
		t.Fatalf("ip: %v %s", err, out)
	}
	f, err := os.Open(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var before, after unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &before); err != nil {
		t.Fatal(err)
	}
	h, err := Handle(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.LinkByName(link); err != nil {
		t.Fatalf("%s in the namespace: %v", link, err)
	}
	if err := unix.Stat("/proc/thread-self/ns/net", &after); err != nil || after.Ino != before.Ino {
		t.Fatalf("caller's thread moved: %d -> %d (%v)", before.Ino, after.Ino, err)
	}
	if out, err := exec.Command("ip", "link", "show", link).CombinedOutput(); err == nil {
		t.Fatalf("%s visible on the host:\n%s", link, out)
	}
}
