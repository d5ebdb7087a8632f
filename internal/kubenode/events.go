package kubenode

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// EventsController is the reporting controller of the agent's Events.
const EventsController = "ipledger.io/ipledgerd"

// Events records Kubernetes Events (events.k8s.io/v1) on this node's Node
// object, where `kubectl describe node` shows them, and on the pods of this node
// (PodEvent), where `kubectl describe pod` does. Recording never blocks: the
// Event is queued and sent in the background, retried a few times; one that
// cannot be sent is logged and dropped.
type Events struct {
	rec  recorder
	node *corev1.ObjectReference
	log  *slog.Logger

	mu sync.Mutex
	// sent: when each Pod Event (pod, reason, note) was last recorded, for the
	// dedupe; window and budget: the Pod Events recorded in the current minute.
	sent   map[podEventKey]time.Time
	window time.Time
	budget int
	now    func() time.Time
}

// recorder records an Event regarding an object and never blocks. It is the
// method of client-go's events.EventRecorder, so that a test can pass its
// FakeRecorder; the agent's is a sender.
type recorder interface {
	Eventf(regarding runtime.Object, related runtime.Object, eventtype, reason, action, note string, args ...any)
}

// podEventKey is what makes two Pod Events the same.
type podEventKey struct{ pod, reason, note string }

// Bounds on Pod Events: the same Event (pod, reason, note) is recorded once in
// PodEventDedupe; at most PodEventsPerMinute are recorded a minute (a node
// releasing hundreds of leases at once, as after a runtime restart, does not flood
// the API server; the agent's log has every one).
const (
	PodEventDedupe     = 10 * time.Minute
	PodEventsPerMinute = 120
	// maxPodEventKeys bounds the dedupe's memory.
	maxPodEventKeys = 4096
)

// NewEvents returns the Events of the node named self, sent through cfg until ctx
// ends.
func NewEvents(ctx context.Context, cfg *rest.Config, self string, log *slog.Logger) (*Events, error) {
	if self == "" {
		return nil, errors.New("kubenode: this node's name is empty; pass --node-name or set NODE_NAME")
	}
	c, err := restClient(cfg, eventsV1)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	snd := newSender(c, EventsController, EventsController+"-"+host, log)
	go snd.run(ctx)
	// The kubelet's reference to its Node, UID and all: `kubectl describe node`
	// looks for Events by it.
	node := &corev1.ObjectReference{Kind: "Node", Name: self, UID: types.UID(self)}
	return newEvents(snd, node, log), nil
}

func newEvents(rec recorder, node *corev1.ObjectReference, log *slog.Logger) *Events {
	return &Events{rec: rec, node: node, log: log, sent: map[podEventKey]time.Time{}, now: time.Now}
}

// maxNote is the Event API's limit on a note (message), in bytes.
const maxNote = 1024

// Warning records a Warning Event on the Node; a note over the API's limit is cut
// (the agent's log has it whole).
func (e *Events) Warning(reason, action, note string) {
	e.log.Info("Event on this Node", "type", corev1.EventTypeWarning, "reason", reason, "note", note)
	e.rec.Eventf(e.node, nil, corev1.EventTypeWarning, reason, action, "%s", cut(note))
}

// PodEvent records an Event of eventType (corev1.EventTypeNormal or
// EventTypeWarning) regarding the Pod namespace/name (uid when known, as
// `kubectl describe pod` matches Events by it). An Event recorded in the last
// PodEventDedupe for the same pod, reason and note, or over PodEventsPerMinute, is
// logged only. It never blocks and never fails.
func (e *Events) PodEvent(namespace, name, uid, eventType, reason, action, note string) {
	if namespace == "" || name == "" {
		return // no pod to speak of (a runtime that is not Kubernetes)
	}
	pod := namespace + "/" + name
	if !e.admit(podEventKey{pod: pod + "/" + uid, reason: reason, note: note}) {
		e.log.Debug("Event on a pod not sent (repeated, or over the budget)", "pod", pod, "type", eventType, "reason", reason, "note", note)
		return
	}
	e.log.Info("Event on a pod", "pod", pod, "uid", uid, "type", eventType, "reason", reason, "note", note)
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: namespace, Name: name, UID: types.UID(uid)}
	e.rec.Eventf(ref, nil, eventType, reason, action, "%s", cut(note))
}

// admit reports whether a Pod Event of key k is recorded now, and notes it.
func (e *Events) admit(k podEventKey) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	if t, ok := e.sent[k]; ok && now.Sub(t) < PodEventDedupe {
		return false
	}
	if now.Sub(e.window) >= time.Minute {
		e.window, e.budget = now, PodEventsPerMinute
	}
	if e.budget <= 0 {
		return false
	}
	e.budget--
	if len(e.sent) >= maxPodEventKeys {
		for k, t := range e.sent {
			if now.Sub(t) >= PodEventDedupe {
				delete(e.sent, k)
			}
		}
		if len(e.sent) >= maxPodEventKeys {
			clear(e.sent)
		}
	}
	e.sent[k] = now
	return true
}

// cut shortens a note over the API's limit (the agent's log has it whole).
func cut(note string) string {
	if len(note) > maxNote {
		return strings.ToValidUTF8(note[:maxNote-3], "") + "..."
	}
	return note
}
