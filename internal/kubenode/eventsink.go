package kubenode

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// sender sends the agent's Events (events.k8s.io/v1). It is written here, not
// taken from client-go's tools/events, because that package links the whole
// clientset (see builtinScheme). It keeps what the agent relied on there:
//
//   - Eventf queues the Event and returns; when the queue is full (the API
//     server away for long) the Event is logged and dropped;
//   - one goroutine (run) sends them in order: an Event the same as one
//     created within seriesWindow (regarding, type, reason, action, note) is
//     counted into that Event's series by a patch, as the kubelet's Events
//     are, rather than created again;
//   - a send that fails is tried again after retryAfter, doubling, at most
//     maxTries times; then logged and dropped. An Event the API server refuses
//     as invalid is not tried again.
type sender struct {
	c                    *rest.RESTClient
	controller, instance string
	log                  *slog.Logger
	queue                chan *eventsv1.Event
	now                  func() time.Time
	retryAfter           time.Duration

	// series: the Events created within seriesWindow, by what makes two the
	// same; only run touches it.
	series map[seriesKey]*seriesEvent
}

var _ recorder = (*sender)(nil)

// Bounds of the sender: queueLen Events wait at most (client-go's broadcaster
// keeps 1000); a series is counted within seriesWindow of its last Event (the
// same as client-go's); maxSeries bounds the map.
const (
	queueLen     = 1000
	seriesWindow = 6 * time.Minute
	maxTries     = 5
	maxSeries    = 4096
)

// seriesKey is what makes two Events the same.
type seriesKey struct {
	kind, namespace, name, uid, eventType, reason, action, note string
}

// seriesEvent is an Event created, and how often it was seen.
type seriesEvent struct {
	namespace, name string
	count           int32
	last            time.Time
}

func newSender(c *rest.RESTClient, controller, instance string, log *slog.Logger) *sender {
	return &sender{c: c, controller: controller, instance: instance, log: log, queue: make(chan *eventsv1.Event, queueLen),
		now: time.Now, retryAfter: time.Second, series: map[seriesKey]*seriesEvent{}}
}

// Eventf queues an Event regarding an object reference (*corev1.ObjectReference:
// what this package records Events on); related is not kept. It never blocks.
func (s *sender) Eventf(regarding, _ runtime.Object, eventType, reason, action, note string, args ...any) {
	ref, ok := regarding.(*corev1.ObjectReference)
	if !ok || ref == nil {
		s.log.Error("Event not sent: it regards no object reference", "regarding", fmt.Sprintf("%T", regarding), "reason", reason)
		return
	}
	now := s.now()
	ns := ref.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault // where the kubelet's Events on its Node go
	}
	ev := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", ref.Name, now.UnixNano()), Namespace: ns},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: s.controller,
		ReportingInstance:   s.instance,
		Action:              action,
		Reason:              reason,
		Regarding:           *ref,
		Note:                fmt.Sprintf(note, args...),
		Type:                eventType,
	}
	select {
	case s.queue <- ev:
	default:
		s.log.Warn("Event not sent: the queue is full", "reason", reason, "note", ev.Note)
	}
}

// run sends the queued Events until ctx ends.
func (s *sender) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-s.queue:
			s.send(ctx, ev)
		}
	}
}

// send creates ev, or counts it into the series of the same Event, trying
// again after a failure.
func (s *sender) send(ctx context.Context, ev *eventsv1.Event) {
	r := ev.Regarding
	k := seriesKey{r.Kind, r.Namespace, r.Name, string(r.UID), ev.Type, ev.Reason, ev.Action, ev.Note}
	now := ev.EventTime.Time
	wait := s.retryAfter
	for try := 1; ; try++ {
		err := s.sendOnce(ctx, k, ev, now)
		switch {
		case err == nil:
			return
		case apierrors.IsInvalid(err) || apierrors.IsAlreadyExists(err) || try == maxTries:
			s.log.Warn("Event not sent", "reason", ev.Reason, "note", ev.Note, "tries", try, "err", err)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait *= 2
	}
}

func (s *sender) sendOnce(ctx context.Context, k seriesKey, ev *eventsv1.Event, now time.Time) error {
	if se, ok := s.series[k]; ok && now.Sub(se.last) < seriesWindow {
		err := s.countIn(ctx, se, now)
		if !apierrors.IsNotFound(err) {
			return err
		}
		delete(s.series, k) // gone (its TTL): create it again
	}
	if err := s.c.Post().Namespace(ev.Namespace).Resource("events").Body(ev).Do(ctx).Error(); err != nil {
		return err
	}
	if len(s.series) >= maxSeries {
		for k, se := range s.series {
			if now.Sub(se.last) >= seriesWindow {
				delete(s.series, k)
			}
		}
		if len(s.series) >= maxSeries {
			clear(s.series)
		}
	}
	s.series[k] = &seriesEvent{namespace: ev.Namespace, name: ev.Name, count: 1, last: now}
	return nil
}

// countIn adds an occurrence at now to the series of the Event se.
func (s *sender) countIn(ctx context.Context, se *seriesEvent, now time.Time) error {
	patch, err := json.Marshal(map[string]any{"series": eventsv1.EventSeries{Count: se.count + 1, LastObservedTime: metav1.NewMicroTime(now)}})
	if err != nil {
		return err
	}
	err = s.c.Patch(types.MergePatchType).Namespace(se.namespace).Resource("events").Name(se.name).Body(patch).Do(ctx).Error()
	if err == nil {
		se.count++
		se.last = now
	}
	return err
}
