// Package netenv holds the host network fixtures tests share: named network
// namespaces (Create, the one fixture that netnodes builds on too; Namespace)
// removed when the test ends, and loopback TCP ports nobody listens on.
package netenv

import (
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"testing"

	"github.com/ipledger/ipledger/internal/testenv/debpkg"
)

// NS is a named network namespace.
type NS struct {
	Name string // for `ip -n NAME`
	Path string // /run/netns/NAME: CNI_NETNS, setns(2)
}

var nsSeq atomic.Int64

// Namespace creates a network namespace (Create; iproute2 is installed first if
// it is missing, for the test's `ip -n`) and deletes it in tb.Cleanup; a failed
// deletion fails the test. Its name is prefix followed by this process's PID (so that concurrent test
// processes differ) and a sequence number.
func Namespace(tb testing.TB, prefix string) NS {
	tb.Helper()
	debpkg.Need(tb, debpkg.IPRoute2)
	ns, h := Create(tb, fmt.Sprintf("%s%d-%d", prefix, os.Getpid()%100000, nsSeq.Add(1)))
	h.Close()
	return ns
}

// FreePort returns a TCP port on 127.0.0.1 that nobody listens on now. For code
// that reports its own errors (a restart outside the test's goroutine); tests use
// FreeAddr or FreePorts.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FreeAddr returns a loopback TCP address (127.0.0.1:PORT) nobody listens on now.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	return fmt.Sprintf("127.0.0.1:%d", FreePorts(tb, 1)[0])
}

// FreePorts returns n distinct TCP ports on 127.0.0.1 that nobody listens on now
// (held open together while chosen, so they differ).
func FreePorts(tb testing.TB, n int) []int {
	tb.Helper()
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatalf("free port: %v", err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports
}
