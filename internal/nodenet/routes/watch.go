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
// Values are coalesced. It has subscribed when it returns, so a deletion after
// that is told; if that first subscription failed, or a later one breaks, it
// subscribes again after a pause growing from a tenth of a second to ten, and
// tells once more: what happened meanwhile was not seen. The channel closes
// when ctx ends.
func Watch(ctx context.Context, ns netns.NsHandle, log *slog.Logger) <-chan struct{} {
	out := make(chan struct{}, 1)
	tell := func() {
		select {
		case out <- struct{}{}:
		default:
		}
	}
	sub, err := subscribe(ns)
	go func() {
		defer close(out)
		pause := 100 * time.Millisecond
		for {
			if err == nil {
				err = sub.run(ctx, tell)
			}
			if ctx.Err() != nil {
				return
			}
			log.Warn("node network: no route events; subscribing again", "err", err, "in", pause)
			select {
			case <-ctx.Done():
				return
			case <-time.After(pause):
			}
			pause = min(2*pause, 10*time.Second)
			if sub, err = subscribe(ns); err == nil {
				tell()
			}
		}
	}()
	return out
}

// subscription is one subscription to a namespace's route events.
type subscription struct {
	ch   chan netlink.RouteUpdate
	done chan struct{}
	errc chan error
}

func subscribe(ns netns.NsHandle) (*subscription, error) {
	s := &subscription{ch: make(chan netlink.RouteUpdate, 64), done: make(chan struct{}), errc: make(chan error, 1)}
	opts := netlink.RouteSubscribeOptions{ErrorCallback: func(err error) {
		select {
		case s.errc <- err:
		default:
		}
	}}
	if ns.IsOpen() {
		opts.Namespace = &ns
	}
	if err := netlink.RouteSubscribeWithOptions(s.ch, s.done, opts); err != nil {
		return nil, err
	}
	return s, nil
}

// run tells of each deletion of a route of ours until the subscription breaks
// (its error) or ctx ends, and closes the subscription.
func (s *subscription) run(ctx context.Context, tell func()) error {
	defer func() {
		close(s.done)
		// the subscription's reader may be sending: let it finish
		go func() {
			for range s.ch {
			}
		}()
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case u, ok := <-s.ch:
			if !ok {
				select {
				case err := <-s.errc:
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
