// Package kubenode watches the cluster's Node objects for the agent's Kubernetes
// features: this node's podCIDRs (the usePodCidr ranges), every node's pod CIDRs and
// InternalIP addresses (the routes between nodes), Node deletions and re-creations
// (cluster mode's dead-node reclaim), and this node's NetworkUnavailable condition.
//
// One informer over Nodes (client-go's, the ecosystem's watch with its relist and
// resync) feeds all of them. It keeps only what these uses read (name, podCIDRs,
// addresses): a Node's status carries its images and more, kilobytes each, which a
// thousand-node cluster would otherwise hold in every agent.
package kubenode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/ipledger/ipledger/internal/nodenet"
)

// Errors of PodCIDRs (wrapped with the node's name and the fix).
var (
	// ErrNotSynced: the watch has not listed the Nodes yet (the API server has not
	// answered since the agent started).
	ErrNotSynced = errors.New("the Node watch has not listed the Nodes yet")
	// ErrNoNode: no Node object has this node's name.
	ErrNoNode = errors.New("no Node object of this name")
	// ErrNoPodCIDR: this node's Node has no spec.podCIDRs.
	ErrNoPodCIDR = errors.New("the Node has no spec.podCIDRs")
)

// Node is what the agent reads of a Node object: its name, InternalIP addresses
// (status.addresses, in the Node's order) and spec.podCIDRs (spec.podCIDR when the
// list is empty).
type Node = nodenet.Node

// Resync is how often the informer hands every Node to the handlers again, so a
// route or rule changed behind the agent's back is put right even when no Node
// changes.
const Resync = 5 * time.Minute

// Watch is an informer of the cluster's Nodes, from the point of view of one node
// (Self).
type Watch struct {
	client   *rest.RESTClient
	self     string
	log      *slog.Logger
	informer cache.SharedIndexInformer
	// handler is the registration of the handler that fills nodes: synced
	// only once it has been handed every Node of the first list.
	handler cache.ResourceEventHandlerRegistration
	// beforeEvent, when set (tests), runs before the handler takes each event.
	beforeEvent func()

	mu     sync.Mutex
	nodes  map[string]Node
	synced bool
	// selfNetOK: this node's Node shows NetworkUnavailable=False.
	selfNetOK bool
	changed   chan struct{}
	subs      []Subscriber
}

// Subscriber hears of Node deletions and creations after the first list (cluster
// mode's block manager: a deleted Node's blocks are reclaimed once its lease ends, a
// Node registered again keeps its blocks). Both are called from one goroutine, in
// the order of the events; nothing is reported while the API server does not
// answer. After a broken watch the informer lists again: a Node known before and
// missing from that list was deleted meanwhile and is reported gone, one unknown
// and in it is reported back.
type Subscriber interface {
	// NodeGone: a Node the watch has seen was deleted (once per deletion). A Node
	// it never saw (deleted before the first list, or no Node at all: an agent
	// whose host is not in the cluster) is never reported.
	NodeGone(node string)
	// NodeBack: a Node appeared after the first list (created, or created again
	// after a deletion, as a kubelet re-registers its Node). The Nodes of the
	// first list are not reported.
	NodeBack(node string)
}

// New returns a Watch of the Nodes through cfg, for the node named self. Run starts it.
func New(cfg *rest.Config, self string, log *slog.Logger) (*Watch, error) {
	if self == "" {
		return nil, errors.New("kubenode: this node's name is empty; pass --node-name or set NODE_NAME")
	}
	c, err := restClient(cfg, coreV1)
	if err != nil {
		return nil, err
	}
	return newWatch(c, cache.NewListWatchFromClient(c, "nodes", "", fields.Everything()), self, log)
}

// newWatch returns a Watch of the Nodes lw lists and watches; client patches this
// node's status.
func newWatch(client *rest.RESTClient, lw cache.ListerWatcher, self string, log *slog.Logger) (*Watch, error) {
	w := &Watch{client: client, self: self, log: log, nodes: map[string]Node{}, changed: make(chan struct{}, 1)}
	w.informer = cache.NewSharedIndexInformer(lw, &corev1.Node{}, Resync, cache.Indexers{})
	if err := w.informer.SetTransform(trim); err != nil {
		return nil, fmt.Errorf("kubenode: %w", err)
	}
	// The informer says which Adds come from its first list: a Node in it is no
	// creation. Any later Add is one, whether a watch event or found by the list
	// after a broken watch; a Node such a list misses comes as a
	// DeletedFinalStateUnknown.
	reg, err := w.informer.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc:    func(obj any, inFirstList bool) { w.event(); w.put(obj, !inFirstList) },
		UpdateFunc: func(_, obj any) { w.event(); w.put(obj, false) },
		DeleteFunc: func(obj any) { w.event(); w.remove(obj) },
	})
	if err != nil {
		return nil, fmt.Errorf("kubenode: %w", err)
	}
	w.handler = reg
	return w, nil
}

func (w *Watch) event() {
	if w.beforeEvent != nil {
		w.beforeEvent()
	}
}

// Subscribe adds s to those told of deletions and creations. Call before Run.
func (w *Watch) Subscribe(s Subscriber) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.subs = append(w.subs, s)
}

// Self is this node's name.
func (w *Watch) Self() string { return w.self }

// Run watches until ctx ends. It returns at once; Synced and Changed tell when the
// Nodes are known and when they change. Known means that the handler has taken
// every Node of the first list (its registration's HasSynced), not only the
// informer's cache: before that, Nodes would answer a part of them, and the
// node network would delete the routes to the rest.
func (w *Watch) Run(ctx context.Context) {
	go w.informer.RunWithContext(ctx)
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), w.handler.HasSynced) {
			return
		}
		w.mu.Lock()
		w.synced = true
		w.mu.Unlock()
		w.notify()
		w.log.Info("Node watch listed the Nodes", "nodes", len(w.Nodes()))
	}()
}

// WaitSynced waits until the first list has been read, or ctx ends (false).
func (w *Watch) WaitSynced(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.synced
	})
}

// Changed receives a value after any Node changed (coalesced: one value may stand
// for many changes) and after the first list.
func (w *Watch) Changed() <-chan struct{} { return w.changed }

// Nodes returns every Node known, sorted by name; nil before the first list.
func (w *Watch) Nodes() []Node {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.synced {
		return nil
	}
	out := make([]Node, 0, len(w.nodes))
	for _, n := range w.nodes {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Synced reports whether the first list has been read.
func (w *Watch) Synced() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.synced
}

// PodCIDRs returns this node's podCIDRs: ErrNotSynced, ErrNoNode or ErrNoPodCIDR
// (wrapped with the node's name and the fix) when it cannot.
func (w *Watch) PodCIDRs() ([]netip.Prefix, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.synced {
		return nil, fmt.Errorf("Node %q: %w; it retries until the API server answers", w.self, ErrNotSynced)
	}
	n, ok := w.nodes[w.self]
	if !ok {
		return nil, fmt.Errorf("Node %q: %w; --node-name must be the node's Kubernetes name (the DaemonSet passes spec.nodeName)", w.self, ErrNoNode)
	}
	if len(n.PodCIDRs) == 0 {
		return nil, fmt.Errorf("Node %q: %w; run kube-controller-manager with --allocate-node-cidrs and --cluster-cidr (or set the Node's spec.podCIDRs)", w.self, ErrNoPodCIDR)
	}
	return slices.Clone(n.PodCIDRs), nil
}

// NetworkUnavailable's reason when ipledger set it false.
const ReasonRoutesReady = "IpledgerRoutesReady"

// SetNetworkAvailable sets this Node's NetworkUnavailable condition false (the routes
// to the other nodes are in place), as flannel and the cloud route controller do. It
// patches status.conditions by their merge key, type, and changes nothing else.
func (w *Watch) SetNetworkAvailable(ctx context.Context) error {
	now := metav1.Now()
	patch := map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type:               corev1.NodeNetworkUnavailable,
		Status:             corev1.ConditionFalse,
		Reason:             ReasonRoutesReady,
		Message:            "ipledger set up the routes to every other node's pod addresses",
		LastTransitionTime: now,
		LastHeartbeatTime:  now,
	}}}}
	b, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	if err := w.client.Patch(types.StrategicMergePatchType).Resource("nodes").Name(w.self).SubResource("status").Body(b).Do(ctx).Error(); err != nil {
		return fmt.Errorf("Node %q: setting NetworkUnavailable=False: %w", w.self, err)
	}
	return nil
}

// NetworkAvailable reports whether this node's Node, as last seen, shows
// NetworkUnavailable=False. It is false while there is no such Node, and after the
// Node was created again (a new Node has no condition, or True from a cloud's node
// controller) or another writer set the condition True.
func (w *Watch) NetworkAvailable() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.selfNetOK
}

func (w *Watch) notify() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// put records n; created: a Node added after the first list, reported back to the
// subscribers unless it is known already.
func (w *Watch) put(obj any, created bool) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	v := view(n)
	w.mu.Lock()
	old, had := w.nodes[v.Name]
	w.nodes[v.Name] = v
	netChanged := false
	if v.Name == w.self {
		ok := networkAvailable(n)
		netChanged, w.selfNetOK = ok != w.selfNetOK, ok
	}
	subs := slices.Clone(w.subs)
	w.mu.Unlock()
	if created && !had {
		for _, s := range subs {
			s.NodeBack(v.Name)
		}
	}
	if !had || !equal(old, v) || netChanged {
		w.notify()
	}
}

// remove forgets a deleted Node, reported gone to the subscribers if it was known: a
// Node never seen is never reported.
func (w *Watch) remove(obj any) {
	var name string
	switch o := obj.(type) {
	case *corev1.Node:
		name = o.Name
	case cache.DeletedFinalStateUnknown:
		if n, ok := o.Obj.(*corev1.Node); ok {
			name = n.Name
		} else {
			name = o.Key
		}
	default:
		return
	}
	w.mu.Lock()
	_, had := w.nodes[name]
	delete(w.nodes, name)
	if name == w.self {
		w.selfNetOK = false
	}
	subs := slices.Clone(w.subs)
	w.mu.Unlock()
	if had {
		for _, s := range subs {
			s.NodeGone(name)
		}
		w.notify()
	}
}

// trim keeps what view and networkAvailable read (and what the informer needs:
// name, resourceVersion).
func trim(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	t := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion},
		Spec:       corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
		Status:     corev1.NodeStatus{Addresses: n.Status.Addresses},
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeNetworkUnavailable {
			t.Status.Conditions = []corev1.NodeCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return t, nil
}

// networkAvailable reports whether n's NetworkUnavailable condition is False.
func networkAvailable(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeNetworkUnavailable {
			return c.Status == corev1.ConditionFalse
		}
	}
	return false
}

func view(n *corev1.Node) Node {
	v := Node{Name: n.Name}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			v.PodCIDRs = append(v.PodCIDRs, p.Masked())
		}
	}
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			v.Addrs = append(v.Addrs, ip.Unmap())
		}
	}
	return v
}

func equal(a, b Node) bool {
	return a.Name == b.Name && slices.Equal(a.Addrs, b.Addrs) && slices.Equal(a.PodCIDRs, b.PodCIDRs)
}
