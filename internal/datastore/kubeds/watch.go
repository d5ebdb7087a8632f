package kubeds

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/ipledger/ipledger/internal/datastore"
)

// kwatch is a running watch of one kind.
type kwatch struct {
	ch  chan datastore.Event
	err error // set before ch is closed
}

var _ datastore.Watch = (*kwatch)(nil)

func (w *kwatch) Events() <-chan datastore.Event { return w.ch }
func (w *kwatch) Err() error                     { return w.err }

// Watch streams the changes under prefix after revision from. The apiserver's watch
// starts after the given resourceVersion and delivers one kind's events in
// resourceVersion order; a stream that ends without ctx ending (the apiserver
// restarted, or its request timeout of 30-60 minutes passed) ends the Watch with
// ErrUnavailable, and the caller lists again.
func (s *Store) Watch(ctx context.Context, prefix string, from int64) (datastore.Watch, error) {
	sc, err := parsePrefix(prefix)
	if err != nil {
		return nil, err
	}
	if err := ctxDone(ctx, "watch", prefix); err != nil {
		return nil, err
	}
	if from <= 0 {
		return nil, fmt.Errorf("kubeds: watch %s: %w: from %d (watch from the revision a List returned)", prefix, datastore.ErrInvalid, from)
	}
	kw, err := s.res(sc.kind).Watch(ctx, metav1.ListOptions{
		LabelSelector:   sc.selector,
		ResourceVersion: strconv.FormatInt(from, 10),
	})
	if err != nil {
		return nil, mapErr(ctx, "watch", prefix, err)
	}
	w := &kwatch{ch: make(chan datastore.Event, 64)}
	go w.run(ctx, kw, prefix)
	return w, nil
}

func (w *kwatch) run(ctx context.Context, kw watch.Interface, prefix string) {
	defer close(w.ch)
	defer kw.Stop()
	for {
		var ev watch.Event
		var ok bool
		select {
		case <-ctx.Done():
			return
		case ev, ok = <-kw.ResultChan():
		}
		if !ok {
			if ctx.Err() == nil {
				w.err = fmt.Errorf("kubeds: watch %s: %w: the apiserver ended the stream; list again", prefix, datastore.ErrUnavailable)
			}
			return
		}
		var typ datastore.EventType
		switch ev.Type {
		case watch.Added, watch.Modified:
			typ = datastore.Put
		case watch.Deleted:
			typ = datastore.Deleted
		case watch.Bookmark:
			continue
		case watch.Error:
			if ctx.Err() != nil {
				return
			}
			err := apierrors.FromObject(ev.Object)
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				w.err = fmt.Errorf("kubeds: watch %s: %w: %w", prefix, datastore.ErrCompacted, err)
			} else {
				w.err = fmt.Errorf("kubeds: watch %s: %w: %w", prefix, datastore.ErrUnavailable, err)
			}
			return
		default:
			continue
		}
		obj, isObj := ev.Object.(*unstructured.Unstructured)
		if !isObj {
			w.err = fmt.Errorf("kubeds: watch %s: %w: unexpected %T in a %s event", prefix, datastore.ErrUnavailable, ev.Object, ev.Type)
			return
		}
		key := obj.GetAnnotations()[AnnotationKey]
		if !strings.HasPrefix(key, prefix) {
			continue
		}
		kv, err := toKV(obj)
		if err != nil {
			w.err = fmt.Errorf("kubeds: watch %s: %w: %w", prefix, datastore.ErrUnavailable, err)
			return
		}
		if typ == datastore.Deleted {
			kv.Value = nil
		}
		select {
		case w.ch <- datastore.Event{Type: typ, KV: kv}:
		case <-ctx.Done():
			return
		}
	}
}
