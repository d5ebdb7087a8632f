package cri

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// Reconnecting is a client that dials the endpoint on first use and again after a
// failed dial or call, so the runtime need not answer when it is made and a runtime
// restart costs one failed call. It is safe for concurrent use.
type Reconnecting struct {
	endpoint string
	timeout  time.Duration
	log      *slog.Logger
	// onErr counts a failed call (list, status, version); set before any call.
	onErr func(call string)
	mu    sync.Mutex
	c     *Client
}

// NewReconnecting returns a client of endpoint that has not dialed yet; timeout
// bounds every dial and call as in Dial. log (nil: none) records each connection.
func NewReconnecting(endpoint string, timeout time.Duration, log *slog.Logger) *Reconnecting {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Reconnecting{endpoint: endpoint, timeout: timeout, log: log}
}

// OnError has fn called with "list", "status" or "version" after each failed call
// (a NotFound status is an answer, not a failure). Call it before any call.
func (r *Reconnecting) OnError(fn func(call string)) { r.onErr = fn }

func (r *Reconnecting) failed(call string) {
	if r.onErr != nil {
		r.onErr(call)
	}
}

func (r *Reconnecting) client(ctx context.Context) (*Client, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.c != nil {
		return r.c, nil
	}
	c, err := Dial(ctx, r.endpoint, r.timeout)
	if err != nil {
		return nil, err
	}
	r.log.Info("connected to the container runtime", "cri", r.endpoint)
	r.c = c
	return c, nil
}

// Close releases the connection, if any.
func (r *Reconnecting) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.c != nil {
		r.c.Close()
	}
}

// ListSandboxes is Client.ListSandboxes.
func (r *Reconnecting) ListSandboxes(ctx context.Context) ([]Sandbox, error) {
	c, err := r.client(ctx)
	if err != nil {
		r.failed("list")
		return nil, err
	}
	sbs, err := c.ListSandboxes(ctx)
	if err != nil {
		r.failed("list")
		r.drop(c)
	}
	return sbs, err
}

// drop closes a client whose call failed, so the next call dials afresh instead of
// waiting out gRPC's reconnect backoff after a runtime restart.
func (r *Reconnecting) drop(c *Client) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.c == c {
		r.c = nil
		c.Close()
	}
}

// SandboxStatus is Client.SandboxStatus.
func (r *Reconnecting) SandboxStatus(ctx context.Context, id string) (Sandbox, error) {
	c, err := r.client(ctx)
	if err != nil {
		r.failed("status")
		return Sandbox{}, err
	}
	sb, err := c.SandboxStatus(ctx, id)
	if err != nil && !errors.Is(err, ErrNotFound) {
		r.failed("status")
		r.drop(c)
	}
	return sb, err
}

// Version is Client.Version.
func (r *Reconnecting) Version(ctx context.Context) (RuntimeVersion, error) {
	c, err := r.client(ctx)
	if err != nil {
		r.failed("version")
		return RuntimeVersion{}, err
	}
	v, err := c.Version(ctx)
	if err != nil {
		r.failed("version")
		r.drop(c)
		return RuntimeVersion{}, err
	}
	return v, nil
}
