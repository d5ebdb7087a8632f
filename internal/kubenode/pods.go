package kubenode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/ipledger/ipledger/internal/choice"
	"github.com/ipledger/ipledger/internal/clock"
)

// Pods is a cache of the pods bound to one node (field selector
// spec.nodeName=<node>): it lists and watches only that node's pods, never the
// cluster's. It keeps each pod's namespace, name, UID and phase, which is what the
// agent shows beside a lease; the rest of a Pod is dropped as it arrives.
//
// A pod's presence in the cache is always an answer; its absence is one only while
// the cache can vouch for it:
//
//   - every list is a consistent read (resourceVersion ""), and the cache is
//     "listed at" the wall time, on the Clock it was given, when that list
//     started: every pod created before then is in it or was deleted since;
//   - after a watch or list error (the API server unreachable, a revoked token,
//     an error event in the stream) the cache is not trusted until it has listed
//     again: a watch that resumes without a list is refused, so the reflector
//     lists;
//   - a pod is absent "since t" only when the cache listed after t (the reconciler
//     passes its lease's creation); otherwise the cache lists again, at most once
//     per RelistEvery, and answers once it has;
//   - a READY sandbox whose pod the cache lacks while the API server has it
//     ([Pods.ReadySandbox]) makes the cache blind (a --node-name that is not the
//     kubelet's Node name lists nothing): no absence is an answer until a list
//     holds that pod, or shows it and the API server says it is deleted since.
//
// [Pods.Deleted] asks the API server itself (one GET), for a decision that rests on
// a pod's deletion.
type Pods struct {
	node     string
	selector string
	log      *slog.Logger
	clk      clock.Clock
	get      podGetter
	lw       *trackedLW
	refl     *cache.Reflector

	ctx context.Context // Run's, for the checks Replace starts

	mu     sync.Mutex
	synced bool
	byUID  map[string]podFact
	byName map[string]podFact // "namespace/name"
	// listedAt is when the list the cache holds started (wall, on clk).
	listedAt time.Time
	// broken says why the cache is not trusted since listedAt ("" when it is);
	// brokenAt is when that was first seen.
	broken   string
	brokenAt time.Time
	blind    *blindness
	// asked is the Mono reading of the last relist asked for (asked0: none yet),
	// checked that of the last live check of a READY sandbox's pod.
	asked, checked   time.Duration
	asked0, checked0 bool
	// getNS reads a namespace from the API server (NamespaceChoices); nil: none
	getNS func(ctx context.Context, name string) (*corev1.Namespace, error)
	// ns is the namespaces' list and watch (NamespaceChoices); nil: none
	ns *nsCache
	// getNode reads this node's Node from the API server (NodeLabels); nil: none
	getNode func(ctx context.Context) (*corev1.Node, error)
}

// podGetter reads one pod from the API server itself (a consistent GET).
type podGetter func(ctx context.Context, namespace, name string) (*corev1.Pod, error)

// blindness is a READY sandbox's pod that the API server has and the cache lacks.
type blindness struct {
	namespace, name, uid string
	boundTo              string // the pod's spec.nodeName in the API
	since                time.Time
}

// RelistEvery bounds how often the cache lists again because a question could not
// be answered (a pod absent since before the last list, or a blind cache), and how
// often a READY sandbox's missing pod is looked up in the API server.
const RelistEvery = 10 * time.Second

// liveTimeout bounds one GET of a pod.
const liveTimeout = 5 * time.Second

// podFact is what Pods keeps of one pod.
type podFact struct {
	namespace, name, uid string
	// static is, for a mirror pod, the UID of the static pod it mirrors (its
	// kubernetes.io/config.mirror annotation): the kubelet runs the static pod,
	// and the runtime and CNI_ARGS know it by that UID, not the mirror's.
	static string
	phase  corev1.PodPhase
	// choices are the pod's ipledger.io/pool and ipledger.io/ip annotations, only
	// those present (nil for most pods)
	choices map[string]string
	// statefulSet is the StatefulSet controlling the pod (its controller
	// ownerReference of kind StatefulSet), "" for any other pod
	statefulSet string
}

// mirrorAnnotation names, on a mirror pod, the UID of the static pod it mirrors.
const mirrorAnnotation = "kubernetes.io/config.mirror"

// NewPods returns the cache of the pods bound to the node named node, through cfg;
// clk dates its lists. Run starts it.
func NewPods(cfg *rest.Config, node string, clk clock.Clock, log *slog.Logger) (*Pods, error) {
	if node == "" {
		return nil, errors.New("kubenode: this node's name is empty; pass --node-name or set NODE_NAME")
	}
	c, err := restClient(cfg, coreV1)
	if err != nil {
		return nil, err
	}
	sel := fields.OneTermEqualSelector("spec.nodeName", node)
	get := func(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
		pod := &corev1.Pod{}
		return pod, c.Get().Namespace(namespace).Resource("pods").Name(name).Do(ctx).Into(pod)
	}
	p := newPods(cache.NewListWatchFromClient(c, "pods", metav1.NamespaceAll, sel), get, node, clk, log)
	p.getNS = func(ctx context.Context, name string) (*corev1.Namespace, error) {
		ns := &corev1.Namespace{}
		return ns, c.Get().Resource("namespaces").Name(name).Do(ctx).Into(ns)
	}
	p.ns = newNSCache(cache.NewListWatchFromClient(c, "namespaces", metav1.NamespaceAll, fields.Everything()))
	p.getNode = func(ctx context.Context) (*corev1.Node, error) {
		n := &corev1.Node{}
		return n, c.Get().Resource("nodes").Name(node).Do(ctx).Into(n)
	}
	return p, nil
}

func newPods(lw cache.ListerWatcher, get podGetter, node string, clk clock.Clock, log *slog.Logger) *Pods {
	if clk == nil {
		clk = clock.NewSystem()
	}
	p := &Pods{node: node, selector: fields.OneTermEqualSelector("spec.nodeName", node).String(), log: log, clk: clk, get: get,
		byUID: map[string]podFact{}, byName: map[string]podFact{}, ctx: context.Background()}
	p.lw = &trackedLW{inner: cache.ToListerWatcherWithContext(lw), p: p}
	p.refl = cache.NewReflectorWithOptions(p.lw, &corev1.Pod{}, podStore{p}, cache.ReflectorOptions{Name: "pods of node " + node})
	return p
}

// Run lists and watches until ctx ends. It returns at once; Synced tells when the
// pods are known.
func (p *Pods) Run(ctx context.Context) {
	p.mu.Lock()
	p.ctx = ctx
	p.mu.Unlock()
	go p.refl.RunWithContext(ctx)
	if p.ns != nil {
		p.ns.run(ctx)
	}
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

// Pod reports what the cache says of a pod of this node: known is false when
// nothing can be told (before the first list; or the pod is not in the cache and
// the cache cannot vouch for its absence, see [Pods]); then inAPI says whether the
// pod exists and phase is its status.phase (Pending, Running, Succeeded, Failed;
// "" when it exists without one yet). A non-empty uid is matched by UID only (a
// static pod's UID finds its mirror pod): a pod deleted and created again under the
// same name is another pod. Without one, the pod is matched by namespace and name.
// It never calls the API server.
func (p *Pods) Pod(namespace, name, uid string) (phase string, inAPI, known bool) {
	return p.PodSince(namespace, name, uid, time.Time{})
}

// PodSince is Pod for a pod known to exist at since (its lease's creation): its
// absence is an answer only when the cache listed after since. When it did not,
// the cache lists again (at most once per RelistEvery), so that a later question
// gets an answer. A zero since asks for no such list.
func (p *Pods) PodSince(namespace, name, uid string, since time.Time) (phase string, inAPI, known bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.synced {
		return "", false, false
	}
	if f, ok := p.lookupLocked(namespace, name, uid); ok {
		return string(f.phase), true, true
	}
	switch {
	case p.broken != "":
		return "", false, false // the reflector is listing again already
	case p.blind != nil || (!since.IsZero() && !p.listedAt.After(since)):
		p.askRelistLocked()
		return "", false, false
	}
	return "", false, true
}

func (p *Pods) lookupLocked(namespace, name, uid string) (podFact, bool) {
	if uid != "" {
		f, ok := p.byUID[uid]
		return f, ok
	}
	f, ok := p.byName[namespace+"/"+name]
	return f, ok
}

// askRelistLocked has the reflector list again, unless it was asked less than
// RelistEvery ago. p.mu must be held.
func (p *Pods) askRelistLocked() {
	now := p.clk.Mono()
	if p.asked0 && now-p.asked < RelistEvery {
		return
	}
	p.asked, p.asked0 = now, true
	p.lw.relist()
}

// ReadySandbox is told, by the reconciler, of a pod whose sandbox the runtime
// reports READY: such a pod exists in the API server. When the cache lacks it, one
// GET (at most once per RelistEvery) asks the API server; if it has the pod, the
// cache is blind (see [Pods]) until a list holds the pod, and lists again. A pod
// the API server does not have (deleted with --grace-period=0 while its sandbox
// still runs) or cannot be asked about changes nothing.
func (p *Pods) ReadySandbox(ctx context.Context, namespace, name, uid string) {
	if uid == "" && (namespace == "" || name == "") {
		return
	}
	p.mu.Lock()
	_, in := p.lookupLocked(namespace, name, uid)
	now := p.clk.Mono()
	if !p.synced || in || p.broken != "" || p.blind != nil || (p.checked0 && now-p.checked < RelistEvery) {
		p.mu.Unlock()
		return
	}
	p.checked, p.checked0 = now, true
	p.mu.Unlock()
	pod, deleted, err := p.live(ctx, namespace, name, uid)
	if err != nil || deleted {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, in := p.lookupLocked(namespace, name, uid); in || p.blind != nil {
		return // arrived meanwhile
	}
	p.blind = &blindness{namespace: namespace, name: name, uid: string(pod.UID), boundTo: pod.Spec.NodeName, since: p.clk.Now()}
	p.log.Warn("pod watch blind: "+p.blind.text(p.selector)+"; no pod is taken as deleted until a list holds it", "node", p.node)
	p.askRelistLocked()
}

func (b *blindness) text(selector string) string {
	s := fmt.Sprintf("READY sandbox %s/%s (%s) not in the cache listed with %s", b.namespace, b.name, b.uid, selector)
	if b.boundTo != "" {
		s += fmt.Sprintf(" (the API binds it to %q)", b.boundTo)
	}
	return s + "; is --node-name the kubelet's Node name?"
}

// Deleted asks the API server (one consistent GET, not the cache) whether the pod
// is deleted: it is when the server does not have it, or has another pod under its
// name (another UID, and not the mirror of the static pod uid). Any error is
// returned: then nothing is known.
func (p *Pods) Deleted(ctx context.Context, namespace, name, uid string) (bool, error) {
	_, deleted, err := p.live(ctx, namespace, name, uid)
	return deleted, err
}

func (p *Pods) live(ctx context.Context, namespace, name, uid string) (*corev1.Pod, bool, error) {
	if namespace == "" || name == "" {
		return nil, false, fmt.Errorf("kubenode: pod %s/%s (%s): no namespace and name to ask the API server for", namespace, name, uid)
	}
	ctx, cancel := context.WithTimeout(ctx, liveTimeout)
	defer cancel()
	pod, err := p.get(ctx, namespace, name)
	switch {
	case apierrors.IsNotFound(err):
		return nil, true, nil
	case err != nil:
		return nil, false, fmt.Errorf("kubenode: GET pod %s/%s: %w", namespace, name, err)
	case uid != "" && string(pod.UID) != uid && pod.Annotations[mirrorAnnotation] != uid:
		return pod, true, nil
	}
	return pod, false, nil
}

// Problems says why the cache's word on absent pods is not taken now, for doctor:
// the watch broken since a time, or blind. None when it is.
func (p *Pods) Problems() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	if !p.synced {
		out = append(out, fmt.Sprintf("pod watch of node %s (%s) has not listed yet: %s", p.node, p.selector, orNone(p.broken)))
	} else if p.broken != "" {
		out = append(out, fmt.Sprintf("pod watch of node %s (%s) broken since %s (%s); last list %s: no pod is taken as deleted until it lists again",
			p.node, p.selector, p.brokenAt.Format(time.RFC3339), p.broken, p.listedAt.Format(time.RFC3339)))
	}
	if p.blind != nil {
		out = append(out, "pod watch blind: "+p.blind.text(p.selector))
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "no error yet"
	}
	return s
}

// failed records that the cache is not trusted until it lists again.
func (p *Pods) failed(why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.broken == "" {
		p.brokenAt = p.clk.Now()
		p.log.Warn("Pod watch broken; no pod is taken as deleted until it lists again", "node", p.node, "err", why)
	}
	p.broken = why
}

// replaced installs a list that started at start.
func (p *Pods) replaced(items []any, start time.Time) {
	byUID, byName := map[string]podFact{}, map[string]podFact{}
	for _, it := range items {
		if f, ok := factOf(it); ok {
			putFact(byUID, byName, f)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	first := !p.synced
	if p.broken != "" {
		p.log.Info("Pod watch listed again", "node", p.node, "pods", len(byName), "brokenSince", p.brokenAt)
	}
	p.byUID, p.byName, p.listedAt, p.synced, p.broken = byUID, byName, start, true, ""
	if first {
		p.log.Info("Pod watch listed this node's pods", "node", p.node, "selector", p.selector, "pods", len(byName))
	}
	if b := p.blind; b != nil {
		if _, in := byUID[b.uid]; in {
			p.log.Info("pod watch no longer blind: the list holds "+b.namespace+"/"+b.name, "node", p.node)
			p.blind = nil
		} else {
			go p.recheckBlind(b)
		}
	}
}

// recheckBlind asks the API server whether the pod that made the cache blind is
// deleted, after a list that lacks it: then the list lacks it for that reason, and
// the cache sees again.
func (p *Pods) recheckBlind(b *blindness) {
	p.mu.Lock()
	ctx := p.ctx
	p.mu.Unlock()
	_, deleted, err := p.live(ctx, b.namespace, b.name, b.uid)
	if err != nil || !deleted {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blind == b {
		p.log.Info("pod watch no longer blind: "+b.namespace+"/"+b.name+" was deleted", "node", p.node)
		p.blind = nil
	}
}

func factOf(obj any) (podFact, bool) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return podFact{}, false
	}
	return podFact{namespace: pod.Namespace, name: pod.Name, uid: string(pod.UID), static: pod.Annotations[mirrorAnnotation], phase: pod.Status.Phase, choices: choicesOf(pod.Annotations), statefulSet: statefulSetOf(pod)}, true
}

// choicesOf keeps the address-choice annotations of annotations, nil when none.
func choicesOf(annotations map[string]string) map[string]string {
	var out map[string]string
	for _, k := range []string{choice.Pool, choice.IP} {
		if v, ok := annotations[k]; ok {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// NamespaceChoices returns the address-choice annotations of the namespace (only
// ipledger.io/pool applies there): from the list and watch of the namespaces,
// which costs the API server nothing per ADD (a burst of pod starts was one GET
// each); by one GET when that cache cannot vouch for the namespace (not listed
// since the agent started, its watch failed since, or the namespace is not in it
// yet). A namespace the API server does not have has none; an error means the
// API could not be asked.
func (p *Pods) NamespaceChoices(ctx context.Context, namespace string) (map[string]string, error) {
	if namespace == "" {
		return nil, nil
	}
	if p.ns != nil {
		if c, ok := p.ns.lookup(namespace); ok {
			return c, nil
		}
	}
	if p.getNS == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, liveTimeout)
	defer cancel()
	ns, err := p.getNS(ctx, namespace)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("kubenode: GET namespace %s: %w", namespace, err)
	}
	return choicesOf(ns.Annotations), nil
}

// NodeLabels returns the labels of this node's Node, read by one GET (an IPPool's
// node selector is checked against them at an ADD that asks for the pool). An
// error means they could not be read, a Node the API server does not have
// included: its labels are unknown, not empty.
func (p *Pods) NodeLabels(ctx context.Context) (map[string]string, error) {
	if p.getNode == nil {
		return nil, fmt.Errorf("kubenode: no API client to read node %s", p.node)
	}
	ctx, cancel := context.WithTimeout(ctx, liveTimeout)
	defer cancel()
	n, err := p.getNode(ctx)
	if err != nil {
		return nil, fmt.Errorf("kubenode: GET node %s: %w", p.node, err)
	}
	return n.Labels, nil
}

// Choices returns the address-choice annotations (ipledger.io/pool, ipledger.io/ip)
// of the pod, only those present: from the watch's cache, or, when the cache lacks
// the pod (an ADD comes right after the binding the watch may not have delivered
// yet), from a GET of the pod. A pod the API server does not have has none. An
// error means the API could not be asked: the caller must not guess.
func (p *Pods) Choices(ctx context.Context, namespace, name, uid string) (map[string]string, error) {
	p.mu.Lock()
	f, ok := p.lookupLocked(namespace, name, uid)
	p.mu.Unlock()
	if ok {
		return maps.Clone(f.choices), nil
	}
	pod, deleted, err := p.live(ctx, namespace, name, uid)
	if err != nil || deleted {
		return nil, err
	}
	return choicesOf(pod.Annotations), nil
}

func putFact(byUID, byName map[string]podFact, f podFact) {
	if old, had := byName[f.namespace+"/"+f.name]; had && old.uid != f.uid {
		delete(byUID, old.uid)
		if old.static != "" {
			delete(byUID, old.static)
		}
	}
	byUID[f.uid] = f
	if f.static != "" {
		byUID[f.static] = f
	}
	byName[f.namespace+"/"+f.name] = f
}

func (p *Pods) put(obj any) {
	f, ok := factOf(obj)
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	putFact(p.byUID, p.byName, f)
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
