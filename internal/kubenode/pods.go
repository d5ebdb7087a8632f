package kubenode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Pods is an informer of the pods bound to one node (field selector
// spec.nodeName=<node>): it lists and watches only that node's pods, never the
// cluster's. It keeps each pod's namespace, name, UID and phase, which is what the
// agent shows beside a lease; the rest of a Pod (its spec, its containers'
// statuses) is dropped as it arrives.
type Pods struct {
	node     string
	log      *slog.Logger
	informer cache.SharedIndexInformer

	mu     sync.Mutex
	synced bool
	byUID  map[string]podFact
	byName map[string]podFact // "namespace/name"
}

// podFact is what Pods keeps of one pod.
type podFact struct {
	namespace, name, uid string
	// static is, for a mirror pod, the UID of the static pod it mirrors (its
	// kubernetes.io/config.mirror annotation): the kubelet runs the static pod,
	// and the runtime and CNI_ARGS know it by that UID, not the mirror's.
	static string
	phase  corev1.PodPhase
}

// mirrorAnnotation names, on a mirror pod, the UID of the static pod it mirrors.
const mirrorAnnotation = "kubernetes.io/config.mirror"

// NewPods returns the informer of the pods bound to the node named node, through
// cfg. Run starts it.
func NewPods(cfg *rest.Config, node string, log *slog.Logger) (*Pods, error) {
	if node == "" {
		return nil, errors.New("kubenode: this node's name is empty; pass --node-name or set NODE_NAME")
	}
	c, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubenode: client: %w", err)
	}
	sel := fields.OneTermEqualSelector("spec.nodeName", node)
	return newPods(cache.NewListWatchFromClient(c.RESTClient(), "pods", metav1.NamespaceAll, sel), node, log)
}

func newPods(lw cache.ListerWatcher, node string, log *slog.Logger) (*Pods, error) {
	p := &Pods{node: node, log: log, byUID: map[string]podFact{}, byName: map[string]podFact{}}
	p.informer = cache.NewSharedIndexInformer(lw, &corev1.Pod{}, Resync, cache.Indexers{})
	if err := p.informer.SetTransform(trimPod); err != nil {
		return nil, fmt.Errorf("kubenode: %w", err)
	}
	if _, err := p.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    p.put,
		UpdateFunc: func(_, obj any) { p.put(obj) },
		DeleteFunc: p.remove,
	}); err != nil {
		return nil, fmt.Errorf("kubenode: %w", err)
	}
	return p, nil
}

// Run watches until ctx ends. It returns at once; Synced tells when the pods are
// known.
func (p *Pods) Run(ctx context.Context) {
	go p.informer.RunWithContext(ctx)
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), p.informer.HasSynced) {
			return
		}
		p.mu.Lock()
		p.synced = true
		n := len(p.byUID)
		p.mu.Unlock()
		p.log.Info("Pod watch listed this node's pods", "node", p.node, "pods", n)
	}()
}

// Synced reports whether the first list has been read.
func (p *Pods) Synced() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.synced
}

// WaitSynced waits until the first list has been read, or ctx ends (false).
func (p *Pods) WaitSynced(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), p.Synced)
}

// Pod reports what the API says of a pod of this node: known is false before the
// first list (nothing can be told); then inAPI says whether the pod exists and
// phase is its status.phase (Pending, Running, Succeeded, Failed; "" when it
// exists without one yet). A non-empty uid is matched by UID only (a static pod's
// UID finds its mirror pod): a pod deleted and created again under the same name
// is another pod. Without one, the pod is
// matched by namespace and name. It never calls the API server.
func (p *Pods) Pod(namespace, name, uid string) (phase string, inAPI, known bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.synced {
		return "", false, false
	}
	var f podFact
	var ok bool
	if uid != "" {
		f, ok = p.byUID[uid]
	} else {
		f, ok = p.byName[namespace+"/"+name]
	}
	return string(f.phase), ok, true
}

func (p *Pods) put(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	f := podFact{namespace: pod.Namespace, name: pod.Name, uid: string(pod.UID), static: pod.Annotations[mirrorAnnotation], phase: pod.Status.Phase}
	p.mu.Lock()
	defer p.mu.Unlock()
	if old, had := p.byName[f.namespace+"/"+f.name]; had && old.uid != f.uid {
		delete(p.byUID, old.uid)
		if old.static != "" {
			delete(p.byUID, old.static)
		}
	}
	p.byUID[f.uid] = f
	if f.static != "" {
		p.byUID[f.static] = f
	}
	p.byName[f.namespace+"/"+f.name] = f
}

func (p *Pods) remove(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.byUID, string(pod.UID))
	if static := pod.Annotations[mirrorAnnotation]; static != "" {
		if cur, ok := p.byUID[static]; ok && cur.uid == string(pod.UID) {
			delete(p.byUID, static)
		}
	}
	if cur, ok := p.byName[pod.Namespace+"/"+pod.Name]; ok && cur.uid == string(pod.UID) {
		delete(p.byName, pod.Namespace+"/"+pod.Name)
	}
}

// trimPod keeps what Pods reads (and what the informer needs: namespace, name,
// resourceVersion), and a mirror pod's annotation naming its static pod: a pod's
// spec and container statuses are kilobytes each.
func trimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	var ann map[string]string
	if static, ok := pod.Annotations[mirrorAnnotation]; ok {
		ann = map[string]string{mirrorAnnotation: static}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, ResourceVersion: pod.ResourceVersion, Annotations: ann},
		Spec:       corev1.PodSpec{NodeName: pod.Spec.NodeName},
		Status:     corev1.PodStatus{Phase: pod.Status.Phase},
	}, nil
}
