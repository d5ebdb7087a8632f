package kubenode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	eventsv1client "k8s.io/client-go/kubernetes/typed/events/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
)

// EventsController is the reporting controller of the agent's Events.
const EventsController = "ipledger.io/ipledgerd"

// Events records Kubernetes Events (events.k8s.io/v1, through client-go's event
// broadcaster) on this node's Node object, where `kubectl describe node` shows
// them. Recording never blocks: the broadcaster queues the Event and sends it in
// the background, retrying a few times; one it cannot send is logged and dropped.
type Events struct {
	bc   events.EventBroadcaster
	rec  events.EventRecorder
	node *corev1.ObjectReference
	log  *slog.Logger
}

// NewEvents returns the Events of the node named self, sent through cfg until ctx
// ends.
func NewEvents(ctx context.Context, cfg *rest.Config, self string, log *slog.Logger) (*Events, error) {
	if self == "" {
		return nil, errors.New("kubenode: this node's name is empty; pass --node-name or set NODE_NAME")
	}
	c, err := eventsv1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubenode: events client: %w", err)
	}
	bc := events.NewBroadcaster(&events.EventSinkImpl{Interface: c})
	if err := bc.StartRecordingToSinkWithContext(ctx); err != nil {
		return nil, fmt.Errorf("kubenode: events: %w", err)
	}
	context.AfterFunc(ctx, bc.Shutdown)
	// The kubelet's reference to its Node, UID and all: `kubectl describe node`
	// looks for Events by it.
	node := &corev1.ObjectReference{Kind: "Node", Name: self, UID: types.UID(self)}
	return &Events{bc: bc, rec: bc.NewRecorder(scheme.Scheme, EventsController), node: node, log: log}, nil
}

// maxNote is the Event API's limit on a note (message), in bytes.
const maxNote = 1024

// Warning records a Warning Event on the Node; a note over the API's limit is cut
// (the agent's log has it whole).
func (e *Events) Warning(reason, action, note string) {
	e.log.Info("Event on this Node", "type", corev1.EventTypeWarning, "reason", reason, "note", note)
	if len(note) > maxNote {
		note = strings.ToValidUTF8(note[:maxNote-3], "") + "..."
	}
	e.rec.Eventf(e.node, nil, corev1.EventTypeWarning, reason, action, "%s", note)
}
