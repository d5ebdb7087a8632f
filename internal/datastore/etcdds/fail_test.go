package etcdds

import (
	"context"
	"errors"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ipledger/ipledger/internal/datastore"
)

// TestFailMapsErrors: the errors etcd's client returns map to the datastore's
// sentinels. Table of what was seen against real servers (the integration tests
// reach most of them; some, like a member's own deadline, only by timing).
func TestFailMapsErrors(t *testing.T) {
	live := context.Background()
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name string
		ctx  context.Context
		err  error
		want []error
	}{
		{"no leader", live, rpctypes.ErrNoLeader, []error{datastore.ErrUnavailable}},
		{"request timed out", live, rpctypes.ErrTimeout, []error{datastore.ErrUnavailable}},
		{"grpc unavailable", live, status.Error(codes.Unavailable, "connection refused"), []error{datastore.ErrUnavailable}},
		{"member's own deadline", live, status.Error(codes.Unknown, "context deadline exceeded"), []error{datastore.ErrUnavailable}},
		{"no endpoints", live, clientv3.ErrNoAvailableEndpoints, []error{datastore.ErrUnavailable}},
		{"compacted", live, rpctypes.ErrCompacted, []error{datastore.ErrCompacted}},
		{"lease not found", live, rpctypes.ErrLeaseNotFound, []error{datastore.ErrNotFound}},
		{"caller canceled", canceled, status.Error(codes.Canceled, "context canceled"), []error{context.Canceled}},
		{"caller deadline", live, context.DeadlineExceeded, []error{datastore.ErrUnavailable, context.DeadlineExceeded}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := fail(c.ctx, `get "pools/x"`, c.err)
			for _, w := range c.want {
				if !errors.Is(got, w) {
					t.Errorf("fail(%v) = %v, want it to wrap %v", c.err, got, w)
				}
			}
			if errors.Is(got, context.Canceled) && errors.Is(got, datastore.ErrUnavailable) {
				t.Errorf("fail(%v) = %v: a caller's cancel is not unavailability", c.err, got)
			}
		})
	}
	// An unrelated error wraps no sentinel.
	got := fail(live, "x", errors.New("etcdserver: permission denied"))
	for _, s := range []error{datastore.ErrUnavailable, datastore.ErrNotFound, datastore.ErrConflict, datastore.ErrCompacted} {
		if errors.Is(got, s) {
			t.Errorf("permission denied maps to %v", s)
		}
	}
}
