package cri

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// oneSandbox is a runtime that knows one READY sandbox, "a".
type oneSandbox struct {
	runtimeapi.UnimplementedRuntimeServiceServer
}

func (oneSandbox) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "fake", RuntimeVersion: "1.0"}, nil
}

func (oneSandbox) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	return &runtimeapi.ListPodSandboxResponse{Items: []*runtimeapi.PodSandbox{{Id: "a", State: runtimeapi.PodSandboxState_SANDBOX_READY}}}, nil
}

func (oneSandbox) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	if req.GetPodSandboxId() != "a" {
		return nil, status.Error(codes.NotFound, "sandbox not found")
	}
	return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{Id: "a", State: runtimeapi.PodSandboxState_SANDBOX_READY}}, nil
}

// serveRuntime serves oneSandbox on sock until the returned stop is called (or the
// test ends).
func serveRuntime(t *testing.T, sock string) (stop func()) {
	t.Helper()
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(s, oneSandbox{})
	done := make(chan struct{})
	go func() { defer close(done); s.Serve(l) }()
	var once sync.Once
	stop = func() { once.Do(func() { s.Stop(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// TestReconnecting: calls before the runtime answers fail and are counted; the first
// call after it answers dials; NotFound is an answer, not a failure; a failed call
// drops the connection so that the next call dials the restarted runtime afresh.
func TestReconnecting(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "rt.sock")
	r := NewReconnecting("unix://"+sock, time.Second, nil)
	var mu sync.Mutex
	var failed []string
	r.OnError(func(call string) { mu.Lock(); failed = append(failed, call); mu.Unlock() })
	failures := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(failed) }
	t.Cleanup(r.Close)
	current := func() *Client { r.mu.Lock(); defer r.mu.Unlock(); return r.c }
	ctx := t.Context()

	if _, err := r.ListSandboxes(ctx); err == nil {
		t.Fatal("listing without a runtime succeeded")
	}
	if _, err := r.SandboxStatus(ctx, "a"); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("status without a runtime: %v, want a failure that is not NotFound", err)
	}
	if _, err := r.Version(ctx); err == nil {
		t.Fatal("version without a runtime succeeded")
	}
	if got, want := failures(), []string{"list", "status", "version"}; !slices.Equal(got, want) {
		t.Fatalf("failed calls %v, want %v", got, want)
	}

	stop := serveRuntime(t, sock)
	if sbs, err := r.ListSandboxes(ctx); err != nil || len(sbs) != 1 || sbs[0].ID != "a" || !sbs[0].Ready() {
		t.Fatalf("listing: %+v, %v", sbs, err)
	}
	if sb, err := r.SandboxStatus(ctx, "a"); err != nil || !sb.Ready() {
		t.Fatalf("status of a: %+v, %v", sb, err)
	}
	if _, err := r.SandboxStatus(ctx, "gone"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("status of an unknown sandbox: %v, want ErrNotFound", err)
	}
	if v, err := r.Version(ctx); err != nil || v.Name != "fake" || v.Version != "1.0" {
		t.Fatalf("version: %+v, %v", v, err)
	}
	if got := failures(); len(got) != 3 {
		t.Fatalf("failed calls %v after the runtime answered, want no more", got)
	}
	first := current()

	stop()
	if _, err := r.ListSandboxes(ctx); err == nil {
		t.Fatal("listing after the runtime stopped succeeded")
	}
	if got := failures(); len(got) != 4 || got[3] != "list" {
		t.Fatalf("failed calls %v, want a fourth: list", got)
	}
	if current() != nil {
		t.Fatal("the client of a failed call was kept")
	}
	serveRuntime(t, sock)
	if sbs, err := r.ListSandboxes(ctx); err != nil || len(sbs) != 1 {
		t.Fatalf("listing after the runtime came back: %+v, %v", sbs, err)
	}
	if c := current(); c == nil || c == first {
		t.Fatal("no new connection after the runtime came back")
	}
}
