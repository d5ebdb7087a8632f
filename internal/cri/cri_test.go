package cri

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestDialMissingSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "missing.sock")
	endpoint := "unix://" + sock
	_, err := Dial(context.Background(), endpoint, time.Second)
	if err == nil {
		t.Fatal("Dial to a missing socket succeeded")
	}
	if !strings.Contains(err.Error(), endpoint) || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("error %q does not name the endpoint and say the socket is missing", err)
	}
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("error %v does not wrap os.ErrNotExist", err)
	}
}

func TestDialNotAnswering(t *testing.T) {
	// A socket that accepts but never speaks gRPC: Dial must give up within
	// its timeout and name the endpoint.
	sock := filepath.Join(t.TempDir(), "mute.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		conns  []net.Conn
		closed bool
	)
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		closed = true
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed {
				c.Close()
			} else {
				conns = append(conns, c)
			}
			mu.Unlock()
		}
	}()
	start := time.Now()
	_, err = Dial(context.Background(), "unix://"+sock, 300*time.Millisecond)
	if err == nil {
		t.Fatal("Dial to a mute socket succeeded")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Dial took %v, want bounded by its timeout", d)
	}
	if !strings.Contains(err.Error(), sock) {
		t.Fatalf("error %q does not name the endpoint", err)
	}
}

func TestSocketPath(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"unix:///run/containerd/containerd.sock", "/run/containerd/containerd.sock", true},
		{"/run/crio/crio.sock", "/run/crio/crio.sock", true},
		{"unix://relative.sock", "", false},
		{"tcp://127.0.0.1:1234", "", false},
		{"", "", false},
	}
	for _, tt := range tests {
		got, err := socketPath(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("socketPath(%q) = %q, %v; want %q, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestNetnsFromInfo(t *testing.T) {
	tests := []struct {
		name string
		info map[string]string
		want string
	}{
		{"containerd", map[string]string{"info": `{"pid":1,"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"ipc"},{"type":"network","path":"/var/run/netns/cni-1"}]}}}`}, "/var/run/netns/cni-1"},
		{"other key", map[string]string{"x": `{"runtimeSpec":{"linux":{"namespaces":[{"type":"network","path":"/p"}]}}}`}, "/p"},
		{"host network", map[string]string{"info": `{"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"}]}}}`}, ""},
		{"no spec", map[string]string{"info": `{"pid":1}`}, ""},
		{"garbage", map[string]string{"info": `not json`}, ""},
		{"wrong types", map[string]string{"info": `{"runtimeSpec":{"linux":{"namespaces":"x"}}}`}, ""},
		{"nil", nil, ""},
	}
	for _, tt := range tests {
		if got := netnsFromInfo(tt.info); got != tt.want {
			t.Errorf("%s: netnsFromInfo = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestWrapNotFound(t *testing.T) {
	c := &Client{endpoint: "unix:///x.sock"}
	err := c.wrap("sandbox status", "abc", status.Error(codes.NotFound, "an error occurred when try to find sandbox: not found"))
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "abc") {
		t.Fatalf("wrap(NotFound) = %v", err)
	}
	if err := c.wrap("list sandboxes", "", status.Error(codes.Unavailable, "down")); errors.Is(err, ErrNotFound) {
		t.Fatalf("wrap(Unavailable) = %v, must not be ErrNotFound", err)
	}
}
