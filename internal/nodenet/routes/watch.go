package routes

import (
	"context"
	"log/slog"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Watch tells, on the channel it returns, when a route of Protocol left the
// main table of the namespace ns (netns.None(): the caller's): deleted by
// another program (systemd-networkd pruning routes it does not own, an
// operator), or by ipledger itself, which costs one sync that plans nothing.
// Values are coalesced. When the subscription breaks it subscribes again,
// after a pause growing from a tenth of a second to ten, and tells once more:
// what happened meanwhile was not seen. The channel closes when ctx ends.
func Watch(ctx context.Context, ns netns.NsHandle, log *slog.Logger) <-chan struct{} {
	out := make(chan struct{}, 1)
	tell := func() {
		select {
		case out <- struct{}{}:
		default:
		}
	}
	go func() {
		defer close(out)
		pause := 100 * time.Millisecond
		for first := true; ; first = false {
			if !first {
				tell()
			}
			err := watchOnce(ctx, ns, tell)
			if ctx.Err() != nil {
				return
			}
			log.Warn("node network: route events lost; subscribing again", "err", err, "in", pause)
			select {
			case <-ctx.Done():
				return
			case <-time.After(pause):
			}
			pause = min(2*pause, 10*time.Second)
		}
	}()
	return out
}

// watchOnce subscribes to route events and tells of each deletion of a route
// of ours, until the subscription breaks (its error) or ctx ends.
func watchOnce(ctx context.Context, ns netns.NsHandle, tell func()) error {
	ch := make(chan netlink.RouteUpdate, 64)
	done := make(chan struct{})
	defer func() {
		close(done)
		// the subscription's reader may be sending: let it finish
		go func() {
			for range ch {
			}
		}()
	}()
	errc := make(chan error, 1)
	opts := netlink.RouteSubscribeOptions{ErrorCallback: func(err error) {
		select {
		case errc <- err:
		default:
		}
	}}
	if ns.IsOpen() {
		opts.Namespace = &ns
	}
	if err := netlink.RouteSubscribeWithOptions(ch, done, opts); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case u, ok := <-ch:
			if !ok {
				select {
				case err := <-errc:
					return err
				default:
					return ErrWatchClosed
				}
			}
			if u.Type == unix.RTM_DELROUTE && u.Protocol == Protocol && u.Table == unix.RT_TABLE_MAIN {
				tell()
			}
		}
	}
}
