package api_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
)

// TestCallErrors: what Call's error tells its caller about an agent that did not
// answer, over real unix sockets. A caller that acts on "the agent has had the whole
// timeout" (ipam.Forward) reads it from the error, which on a busy machine comes before
// ctx.Err() is set, so the error must carry it: os.ErrDeadlineExceeded for a wait the
// deadline ended, and not for an agent that closed the connection.
func TestCallErrors(t *testing.T) {
	// serve listens on a socket in a fresh directory and hands each connection,
	// after reading its request line, to answer.
	serve := func(t *testing.T, answer func(net.Conn)) string {
		t.Helper()
		sock := filepath.Join(t.TempDir(), "s.sock")
		l, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					if _, err := bufio.NewReader(c).ReadBytes('\n'); err == nil {
						answer(c)
					}
				}()
			}
		}()
		return sock
	}
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	for _, tc := range []struct {
		name               string
		socket             func(t *testing.T) string
		unreachable, noAns bool
		deadline           bool
		timeout            time.Duration // long where the deadline must not end the call, on a loaded machine too
	}{
		{name: "no socket", socket: func(t *testing.T) string { return filepath.Join(t.TempDir(), "none.sock") }, unreachable: true, timeout: time.Minute},
		{name: "closed without an answer", socket: func(t *testing.T) string { return serve(t, func(net.Conn) {}) }, noAns: true, timeout: time.Minute},
		{name: "never answers", socket: func(t *testing.T) string { return serve(t, func(net.Conn) { <-hang }) }, noAns: true, deadline: true, timeout: 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			_, err := api.Call(ctx, tc.socket(t), api.Request{Op: api.OpStatus})
			if err == nil {
				t.Fatal("Call succeeded")
			}
			for _, c := range []struct {
				sentinel error
				want     bool
			}{{api.ErrUnreachable, tc.unreachable}, {api.ErrNoAnswer, tc.noAns}, {os.ErrDeadlineExceeded, tc.deadline}} {
				if got := errors.Is(err, c.sentinel); got != c.want {
					t.Errorf("errors.Is(%q, %q) = %v, want %v", err, c.sentinel, got, c.want)
				}
			}
		})
	}
}
