// Package nsenter runs code on an OS thread inside a network namespace and brings
// the thread back to its own namespace afterwards, or retires it.
//
// A goroutine locked to its thread (runtime.LockOSThread) may setns(2) that thread
// into a pod's namespace. If the way back fails and the thread is then unlocked,
// the Go scheduler hands it to any goroutine, which then works inside the pod's
// namespace believing it is in its own (the agent's, or the host's in a plugin).
// vishvananda/netlink's NewHandleAt does exactly that (its restore unlocks after
// ignoring the error of the way back), so ipledger never calls it: Handle opens the
// sockets through Do instead. Do runs the code on a goroutine of its own, locked to
// its thread, and unlocks only once the thread is back; when it is not, the
// goroutine ends still locked and Go ends the thread with it. The caller's own
// thread never changes namespace.
package nsenter

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Thread is how a thread changes network namespace. The zero value is the real
// system's; tests inject failures.
type Thread struct {
	// Setns moves the calling thread into the network namespace open as fd;
	// nil is setns(fd, CLONE_NEWNET).
	Setns func(fd int) error
	// Unlock releases the thread; nil is runtime.UnlockOSThread. It is called
	// only on a thread known to be in its own namespace.
	Unlock func()
}

func (t Thread) setns(fd int) error {
	if t.Setns != nil {
		return t.Setns(fd)
	}
	return unix.Setns(fd, unix.CLONE_NEWNET)
}

func (t Thread) unlock() {
	if t.Unlock != nil {
		t.Unlock()
		return
	}
	runtime.UnlockOSThread()
}

// Do runs fn on a thread inside the network namespace open as target (an nsfs
// file descriptor) and returns fn's error. Sockets fn opens stay in that namespace.
// The error wraps ErrNotBack when the thread could not return (it is retired).
func (t Thread) Do(target int, fn func() error) error {
	errc := make(chan error, 1)
	go func() { errc <- t.run(target, fn) }()
	return <-errc
}

// run is Do on the current goroutine, which it locks to its thread and leaves
// locked unless the thread is back in its own namespace.
func (t Thread) run(target int, fn func() error) error {
	runtime.LockOSThread()
	own, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		t.unlock() // nothing changed
		return fmt.Errorf("nsenter: the thread's own namespace: %w", err)
	}
	defer own.Close()
	if err := t.setns(target); err != nil {
		t.unlock() // setns(2) changes nothing when it fails
		return fmt.Errorf("nsenter: enter the namespace: %w", err)
	}
	ferr := fn()
	if err := t.setns(int(own.Fd())); err != nil {
		// Stay locked: the thread ends with this goroutine.
		return errors.Join(ferr, fmt.Errorf("%w: %v", ErrNotBack, err))
	}
	t.unlock()
	return ferr
}

// Handle returns a netlink handle whose sockets were opened inside the network
// namespace open as target (nil families: every family netlink supports). Using
// the handle never changes any thread's namespace.
func (t Thread) Handle(target int, families ...int) (*netlink.Handle, error) {
	var h *netlink.Handle
	err := t.Do(target, func() error {
		var err error
		h, err = netlink.NewHandle(families...)
		return err
	})
	if err != nil {
		if h != nil {
			h.Close()
		}
		return nil, err
	}
	return h, nil
}

// Do is Thread{}.Do: the real system's.
func Do(target int, fn func() error) error { return Thread{}.Do(target, fn) }

// Handle is Thread{}.Handle: the real system's.
func Handle(target int, families ...int) (*netlink.Handle, error) {
	return Thread{}.Handle(target, families...)
}
