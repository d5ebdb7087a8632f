package api

import (
	"bufio"
	"context"
	"errors"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// serveOnce listens on a real unix socket and runs handle for each connection.
func serveOnce(t *testing.T, handle func(c net.Conn)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); defer c.Close(); handle(c) }()
		}
	}()
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return sock
}

// answer reads one request and answers resp in pieces of at most chunk bytes.
func answer(t *testing.T, resp *Response, chunk int, got chan<- Request) func(c net.Conn) {
	return func(c net.Conn) {
		req, err := ReadRequest(bufio.NewReader(c))
		if err != nil {
			t.Errorf("agent side: %v", err)
			return
		}
		if got != nil {
			got <- req
		}
		b, err := MarshalResponse(resp)
		if err != nil {
			t.Errorf("agent side: %v", err)
			return
		}
		b = append(b, '\n')
		for len(b) > 0 {
			n := min(chunk, len(b))
			if _, err := c.Write(b[:n]); err != nil {
				return
			}
			b = b[n:]
		}
	}
}

func callCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestCallOnceMatchesCall: the plugin's blocking client sends the same request and
// reads the same answer as Call, whole or in pieces, short or longer than one read.
func TestCallOnceMatchesCall(t *testing.T) {
	long := make([]LeaseView, 200)
	for i := range long {
		long[i] = LeaseView{Network: "n", ContainerID: strings.Repeat("c", 60), IfName: "eth0", IPs: []string{"10.0.0.1/24"}}
	}
	cases := []struct {
		name  string
		resp  Response
		chunk int
	}{
		{"lease", Response{Version: Version, Lease: &LeaseView{Network: "n", ContainerID: "c", IfName: "eth0", IPs: []string{"10.0.0.2/24"}, Gateways: []string{"10.0.0.1"}}}, 1 << 20},
		{"byte by byte", Response{Version: Version, Released: 1}, 1},
		{"longer than a read", Response{Version: Version, Leases: long}, 1000},
		{"agent error", Response{Version: Version, Error: &Error{Code: CodeExhausted, Msg: "pool n is full"}}, 1 << 20},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reqs := make(chan Request, 2)
			sock := serveOnce(t, answer(t, &tc.resp, tc.chunk, reqs))
			req := Request{Op: OpAdd, Network: "n", ContainerID: "c", IfName: "eth0"}
			want, werr := Call(callCtx(t, 30*time.Second), sock, req)
			got, gerr := CallOnce(callCtx(t, 30*time.Second), sock, req)
			if !reflect.DeepEqual(got, want) || (werr == nil) != (gerr == nil) || (gerr != nil && gerr.Error() != werr.Error()) {
				t.Fatalf("CallOnce = %+v, %v; Call = %+v, %v", got, gerr, want, werr)
			}
			if r1, r2 := <-reqs, <-reqs; !reflect.DeepEqual(r1, r2) {
				t.Fatalf("requests differ: Call sent %+v, CallOnce %+v", r1, r2)
			}
		})
	}
}

// TestCallOnceFailures: the errors a plugin maps to CNI codes (and on which DEL
// spools) are those of Call.
func TestCallOnceFailures(t *testing.T) {
	cases := []struct {
		name   string
		sock   func(t *testing.T) string
		ctx    func(t *testing.T) context.Context
		target error
	}{
		{"no socket", func(t *testing.T) string { return filepath.Join(t.TempDir(), "none.sock") }, nil, ErrUnreachable},
		{"closed without answer", func(t *testing.T) string {
			return serveOnce(t, func(c net.Conn) { ReadRequest(bufio.NewReader(c)) })
		}, nil, ErrNoAnswer},
		{"half an answer", func(t *testing.T) string {
			return serveOnce(t, func(c net.Conn) { ReadRequest(bufio.NewReader(c)); c.Write([]byte(`{"version":1,`)) })
		}, nil, ErrNoAnswer},
		{"no answer before the deadline", func(t *testing.T) string {
			return serveOnce(t, func(c net.Conn) { ReadRequest(bufio.NewReader(c)); c.Read(make([]byte, 1)) })
		}, func(t *testing.T) context.Context { return callCtx(t, 200*time.Millisecond) }, ErrNoAnswer},
		{"deadline already passed", func(t *testing.T) string {
			return serveOnce(t, func(c net.Conn) {})
		}, func(t *testing.T) context.Context { return callCtx(t, -time.Second) }, ErrUnreachable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := callCtx(t, 30*time.Second)
			if tc.ctx != nil {
				ctx = tc.ctx(t)
			}
			_, err := CallOnce(ctx, tc.sock(t), Request{Op: OpPing})
			if !errors.Is(err, tc.target) {
				t.Fatalf("CallOnce: %v, want %v", err, tc.target)
			}
			t.Log(err)
		})
	}
}
