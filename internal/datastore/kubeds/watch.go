package kubeds

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/ipledger/ipledger/internal/datastore"
)

// kwatch is a running watch of one resource.
type kwatch struct {
	s      *Store
	sc     scope
	ch     chan datastore.Event
	err    error // set before ch is closed
	last   int64 // the last resourceVersion seen (event or bookmark)
	opened time.Duration
}

var _ datastore.Watch = (*kwatch)(nil)

func (w *kwatch) Events() <-chan datastore.Event { return w.ch }
func (w *kwatch) Err() error                     { return w.err }

// minStreamLife: a stream the server ends sooner than this after it was opened is
// not resumed (a server closing every stream at once would make a busy loop).
const minStreamLife = time.Second

// Watch streams the changes under prefix after revision from. The apiserver's watch
// starts after the given resourceVersion and delivers one resource's events in
// resourceVersion order, with bookmarks that keep the last resourceVersion current.
// A stream the apiserver ends (its request timeout, 30-60 minutes by default) is
// resumed from the last resourceVersion seen; if that fails the Watch ends with
// ErrUnavailable (unreachable) or ErrCompacted (a restarted apiserver's watch cache
// starts at its restart), and the caller lists again.
func (s *Store) Watch(ctx context.Context, prefix string, from int64) (datastore.Watch, error) {
	sc, err := parsePrefix(prefix)
	if err != nil {
		return nil, err
	}
	if err := ctxDone(ctx, "watch", prefix); err != nil {
		return nil, err
	}
	if from <= 0 {
		return nil, fmt.Errorf("kubeds: watch %q: %w: from %d (watch from the revision a List returned)", prefix, datastore.ErrInvalid, from)
	}
	w := &kwatch{s: s, sc: sc, ch: make(chan datastore.Event, 64), last: from}
	kw, err := w.open(ctx)
	if err != nil {
		return nil, err
	}
	go w.run(ctx, kw)
	return w, nil
}

func (w *kwatch) open(ctx context.Context) (watch.Interface, error) {
	w.opened = w.s.clock.Mono()
	kw, err := w.s.res(w.sc.kind).Watch(ctx, metav1.ListOptions{
		LabelSelector:       w.sc.selector,
		ResourceVersion:     strconv.FormatInt(w.last, 10),
		AllowWatchBookmarks: true,
	})
	if err != nil {
		return nil, mapErr(ctx, "watch", w.sc.prefix, err)
	}
	return kw, nil
}

func (w *kwatch) run(ctx context.Context, kw watch.Interface) {
	defer close(w.ch)
	for {
		err := w.pump(ctx, kw)
		kw.Stop()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			w.err = err
			return
		}
		// The server ended the stream: resume where it stopped.
		if w.s.clock.Mono()-w.opened < minStreamLife {
			w.err = fmt.Errorf("kubeds: watch %q: %w: the apiserver ended the stream at once; list again", w.sc.prefix, datastore.ErrUnavailable)
			return
		}
		if kw, err = w.open(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			if !errors.Is(err, datastore.ErrCompacted) && !errors.Is(err, datastore.ErrUnavailable) {
				err = fmt.Errorf("%w: %w", datastore.ErrUnavailable, err)
			}
			w.err = err
			return
		}
	}
}

// pump delivers one stream's events. It returns nil when the stream ended by
// itself (or ctx ended), else why the watch must end.
func (w *kwatch) pump(ctx context.Context, kw watch.Interface) error {
	prefix := w.sc.prefix
	for {
		var ev watch.Event
		var ok bool
		select {
		case <-ctx.Done():
			return nil
		case ev, ok = <-kw.ResultChan():
		}
		if !ok {
			return nil
		}
		var typ datastore.EventType
		switch ev.Type {
		case watch.Added, watch.Modified:
			typ = datastore.Put
		case watch.Deleted:
			typ = datastore.Deleted
		case watch.Bookmark:
			if obj, isObj := ev.Object.(*unstructured.Unstructured); isObj {
				if rv, err := parseRev(obj.GetResourceVersion(), "bookmark"); err == nil && rv > w.last {
					w.last = rv
				}
			}
			continue
		case watch.Error:
			err := apierrors.FromObject(ev.Object)
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				return fmt.Errorf("kubeds: watch %q: %w: %w", prefix, datastore.ErrCompacted, err)
			}
			return fmt.Errorf("kubeds: watch %q: %w: %w", prefix, datastore.ErrUnavailable, err)
		default:
			continue
		}
		obj, isObj := ev.Object.(*unstructured.Unstructured)
		if !isObj {
			return fmt.Errorf("kubeds: watch %q: %w: unexpected %T in a %s event", prefix, datastore.ErrUnavailable, ev.Object, ev.Type)
		}
		rv, err := parseRev(obj.GetResourceVersion(), "watch event")
		if err != nil {
			return fmt.Errorf("kubeds: watch %q: %w: %w", prefix, datastore.ErrUnavailable, err)
		}
		if rv <= w.last {
			continue // already delivered before a resume
		}
		w.last = rv
		if key, ok := objKey(obj); !ok || !strings.HasPrefix(key, prefix) {
			continue
		}
		kv, err := toKV(obj)
		if err != nil {
			return fmt.Errorf("kubeds: watch %q: %w: %w", prefix, datastore.ErrUnavailable, err)
		}
		if typ == datastore.Deleted {
			kv.Value = nil
		}
		select {
		case w.ch <- datastore.Event{Type: typ, KV: kv}:
		case <-ctx.Done():
			return nil
		}
	}
}
