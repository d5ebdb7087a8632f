// Package kubeds is the datastore on the Kubernetes API: one custom resource per
// record, compare-and-swap on metadata.resourceVersion, a coordination.k8s.io Lease
// per node.
//
// Records: "pools/<network>" is a cluster-scoped IPPool (ippools.ipledger.io) named
// <network>; "reservations/<name>" a cluster-scoped IPReservation
// (ipreservations.ipledger.io) named <name>; "blocks/<network>/<block>" a
// cluster-scoped IPBlock (ipblocks.ipledger.io) named "<network>.<block>"; keys of
// any other kind are IPRecords
// (iprecords.ipledger.io) labelled with their kind. Keys whose readable name is no
// valid object name get a hashed one (see parseKey). The record's JSON object is the
// object's spec, so the value comes back re-encoded by the server (keys sorted, no
// spaces) with the same content. Every object carries its key in the annotation
// ipledger.io/key and its first name segment (the network) in the label
// ipledger.io/network, which List and Watch select on. The CRDs and the RBAC rules
// are in deploy/ipledger.yaml (InstallCRDs applies the CRDs from it).
//
// Revisions are resourceVersions, numeric on the etcd3 storage every apiserver uses;
// a non-numeric one is an error. Update is a PUT with the resourceVersion read,
// Delete carries it as a precondition, Create fails on AlreadyExists: the apiserver
// compares them in one etcd transaction. Watches start at a resourceVersion with a
// label selector; "too old resource version" (410) is ErrCompacted. The apiserver
// serves watches from its watch cache, which starts anew when the apiserver
// restarts: a watch from a revision before the restart is ErrCompacted, and the
// caller lists again. Node leases are Leases named ipledger-<node> in one namespace;
// Renew is a merge patch carrying the resourceVersion (and UID) read, so another
// writer's change makes it fail with ErrConflict.
//
// The dynamic client is used (no generated clientset, no code generator step): the
// records are JSON objects already.
package kubeds

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/datastore"
)

// DefaultNamespace is where node Leases live unless Options.Namespace says otherwise
// (the namespace deploy/ipledger.yaml creates).
const DefaultNamespace = "ipledger"

// Options configures a Store.
type Options struct {
	// Namespace of the node Leases (default DefaultNamespace).
	Namespace string
	// Clock gives the Leases' acquireTime and renewTime (default the system clock).
	// Nothing decides on those times: observers judge expiry by revisions.
	Clock clock.Clock
}

// Store is the datastore on the Kubernetes API. Calls are bounded by their ctx only
// (no client timeout, which would also cut watches): give them deadlines. A dead
// connection is noticed by client-go's HTTP/2 health check (about 45 s).
type Store struct {
	cfg    *rest.Config // with QPS and user agent set
	client dynamic.Interface
	ns     string
	clock  clock.Clock
	leases leases
}

var _ datastore.Store = (*Store)(nil)

// New returns a Store talking to the apiserver of cfg. A zero QPS in cfg is raised
// to 1000 (Burst 2000): client-go's default of 5 requests per second would throttle
// an agent claiming blocks, and the apiserver has its own flow control.
func New(cfg *rest.Config, opts Options) (*Store, error) {
	if cfg == nil {
		return nil, errors.New("kubeds: no rest.Config")
	}
	c := rest.CopyConfig(cfg)
	if c.QPS == 0 {
		c.QPS, c.Burst = 1000, 2000
	}
	if c.UserAgent == "" {
		c.UserAgent = "ipledger"
	}
	client, err := dynamic.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("kubeds: client: %w", err)
	}
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.Clock == nil {
		opts.Clock = clock.NewSystem()
	}
	s := &Store{cfg: c, client: client, ns: opts.Namespace, clock: opts.Clock}
	s.leases = leases{s: s}
	return s, nil
}

// LoadConfig returns the credentials to use: the kubeconfig file at path, or the
// pod's in-cluster service account when path is empty.
func LoadConfig(path string) (*rest.Config, error) {
	if path == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubeds: in-cluster config (run in a pod with a service account, or pass --kubeconfig): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubeds: kubeconfig %s: %w", path, err)
	}
	return cfg, nil
}

// Close releases nothing: the client's connections are shared and idle ones time out.
func (s *Store) Close() error { return nil }

// Leases returns the node leases.
func (s *Store) Leases() datastore.Leases { return &s.leases }

func (s *Store) res(k *kind) dynamic.ResourceInterface { return s.client.Resource(k.gvr) }

// Get reads one record.
func (s *Store) Get(ctx context.Context, key string) (datastore.KV, error) {
	ref, err := parseKey(key)
	if err != nil {
		return datastore.KV{}, err
	}
	if err := ctxDone(ctx, "get", key); err != nil {
		return datastore.KV{}, err
	}
	obj, err := s.res(ref.kind).Get(ctx, ref.name, metav1.GetOptions{})
	if err != nil {
		return datastore.KV{}, mapErr(ctx, "get", key, err)
	}
	kv, err := toKV(obj)
	if err != nil {
		return datastore.KV{}, err
	}
	if kv.Key != key {
		return datastore.KV{}, fmt.Errorf("kubeds: get %s: %w (object %s holds key %q)", key, datastore.ErrNotFound, ref.name, kv.Key)
	}
	return kv, nil
}

// Create stores value under key if the key does not exist.
func (s *Store) Create(ctx context.Context, key string, value []byte) (int64, error) {
	ref, err := parseKey(key)
	if err != nil {
		return 0, err
	}
	obj, err := newObject(ref, key, value, 0)
	if err != nil {
		return 0, err
	}
	if err := ctxDone(ctx, "create", key); err != nil {
		return 0, err
	}
	out, err := s.res(ref.kind).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return 0, mapErr(ctx, "create", key, err)
	}
	return revision(out)
}

// Update replaces key's value if its revision is still rev.
func (s *Store) Update(ctx context.Context, key string, value []byte, rev int64) (int64, error) {
	ref, err := parseKey(key)
	if err != nil {
		return 0, err
	}
	if rev <= 0 {
		return 0, fmt.Errorf("kubeds: update %s: %w: revision %d (pass the Revision a Get or List returned)", key, datastore.ErrInvalid, rev)
	}
	obj, err := newObject(ref, key, value, rev)
	if err != nil {
		return 0, err
	}
	obj.SetResourceVersion(strconv.FormatInt(rev, 10))
	if err := ctxDone(ctx, "update", key); err != nil {
		return 0, err
	}
	out, err := s.res(ref.kind).Update(ctx, obj, metav1.UpdateOptions{})
	if err != nil {
		return 0, mapErr(ctx, "update", key, err)
	}
	return revision(out)
}

// Delete removes key if its revision is still rev.
func (s *Store) Delete(ctx context.Context, key string, rev int64) error {
	ref, err := parseKey(key)
	if err != nil {
		return err
	}
	if rev <= 0 {
		return fmt.Errorf("kubeds: delete %s: %w: revision %d (pass the Revision a Get or List returned)", key, datastore.ErrInvalid, rev)
	}
	if err := ctxDone(ctx, "delete", key); err != nil {
		return err
	}
	rv := strconv.FormatInt(rev, 10)
	err = s.res(ref.kind).Delete(ctx, ref.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
	return mapErr(ctx, "delete", key, err)
}

// List returns the records under prefix in key order and the resourceVersion of the
// list.
func (s *Store) List(ctx context.Context, prefix string) ([]datastore.KV, int64, error) {
	sc, err := parsePrefix(prefix)
	if err != nil {
		return nil, 0, err
	}
	if err := ctxDone(ctx, "list", prefix); err != nil {
		return nil, 0, err
	}
	l, err := s.res(sc.kind).List(ctx, metav1.ListOptions{LabelSelector: sc.selector})
	if err != nil {
		return nil, 0, mapErr(ctx, "list", prefix, err)
	}
	rev, err := parseRev(l.GetResourceVersion(), "list "+prefix)
	if err != nil {
		return nil, 0, err
	}
	kvs := make([]datastore.KV, 0, len(l.Items))
	for i := range l.Items {
		if key, ok := objKey(&l.Items[i]); !ok || !strings.HasPrefix(key, prefix) {
			continue // another network's, or not written by ipledger
		}
		kv, err := toKV(&l.Items[i])
		if err != nil {
			return nil, 0, err
		}
		kvs = append(kvs, kv)
	}
	sort.Slice(kvs, func(i, j int) bool { return kvs[i].Key < kvs[j].Key })
	return kvs, rev, nil
}

// newObject is the object holding value under key.
func newObject(ref objRef, key string, value []byte, replaces int64) (*unstructured.Unstructured, error) {
	if err := datastore.CheckValue(key, value); err != nil {
		return nil, fmt.Errorf("kubeds: %w", err)
	}
	// Numbers stay as written (json.Number): no integer above 2^53 is rounded.
	var spec map[string]any
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()
	if err := dec.Decode(&spec); err != nil || spec == nil {
		return nil, fmt.Errorf("kubeds: %w: value of key %q is not a JSON object (it becomes the object's spec)", datastore.ErrInvalid, key)
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/" + Version,
		"kind":       ref.kind.objKind,
		"spec":       spec,
	}}
	obj.SetName(ref.name)
	obj.SetLabels(ref.labels())
	obj.SetAnnotations(map[string]string{AnnotationKey: key, AnnotationSeq: strconv.FormatInt(replaces, 10)})
	return obj, nil
}

// objKey is the datastore key an object holds: its annotation ipledger.io/key. An
// IPPool or IPReservation without it is an operator's (kubectl apply): its key is
// "pools/<name>" or "reservations/<name>", the key parseKey maps to that name.
// false: no key (an object not written by ipledger).
func objKey(obj *unstructured.Unstructured) (string, bool) {
	if key, ok := obj.GetAnnotations()[AnnotationKey]; ok {
		return key, true
	}
	for _, k := range []*kind{poolKind, reservationKind} {
		if obj.GetKind() != k.objKind {
			continue
		}
		key := k.name + "/" + obj.GetName()
		if r, err := parseKey(key); err != nil || r.kind != k || r.name != obj.GetName() {
			return "", false
		}
		return key, true
	}
	return "", false
}

// toKV reads a record back from its object.
func toKV(obj *unstructured.Unstructured) (datastore.KV, error) {
	key, ok := objKey(obj)
	if !ok {
		return datastore.KV{}, fmt.Errorf("kubeds: %s %s has no %s annotation: not written by ipledger", obj.GetKind(), obj.GetName(), AnnotationKey)
	}
	rev, err := revision(obj)
	if err != nil {
		return datastore.KV{}, err
	}
	spec, ok := obj.Object["spec"]
	if !ok || spec == nil {
		spec = map[string]any{}
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return datastore.KV{}, fmt.Errorf("kubeds: %s: spec: %w", key, err)
	}
	return datastore.KV{Key: key, Value: b, Revision: rev}, nil
}

func revision(obj *unstructured.Unstructured) (int64, error) {
	return parseRev(obj.GetResourceVersion(), obj.GetKind()+" "+obj.GetName())
}

// parseRev reads a resourceVersion as a revision. It is etcd's revision on etcd3
// storage; anything else cannot give the store's ordering and is refused.
func parseRev(rv, what string) (int64, error) {
	n, err := strconv.ParseInt(rv, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("kubeds: %s: resourceVersion %q is not a positive integer: this apiserver's storage is not etcd3, and kubeds needs numeric resourceVersions", what, rv)
	}
	return n, nil
}

// ctxDone is the error for a ctx that has ended before a request is sent (nothing is
// sent then, so nothing is applied).
func ctxDone(ctx context.Context, op, key string) error {
	if ctx.Err() == nil {
		return nil
	}
	return mapErr(ctx, op, key, ctx.Err())
}

// mapErr wraps an apiserver error in the datastore's sentinels.
func mapErr(ctx context.Context, op, key string, err error) error {
	if err == nil {
		return nil
	}
	what := fmt.Sprintf("kubeds: %s %q", op, key)
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(cerr, context.DeadlineExceeded) {
			return fmt.Errorf("%s: %w: %w", what, datastore.ErrUnavailable, cerr)
		}
		return fmt.Errorf("%s: %w", what, cerr)
	}
	var sentinel error
	switch {
	case apierrors.IsNotFound(err):
		if strings.Contains(err.Error(), "could not find the requested resource") {
			return fmt.Errorf("%s: %w: the apiserver does not serve this resource: are the CRDs installed? (kubectl apply -f deploy/ipledger.yaml): %v", what, datastore.ErrUnavailable, err)
		}
		sentinel = datastore.ErrNotFound
	case apierrors.IsAlreadyExists(err):
		sentinel = datastore.ErrExists
	case apierrors.IsConflict(err):
		sentinel = datastore.ErrConflict
	case apierrors.IsResourceExpired(err), apierrors.IsGone(err):
		sentinel = datastore.ErrCompacted
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsRequestEntityTooLargeError(err):
		sentinel = datastore.ErrInvalid
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return fmt.Errorf("%s: %w (the ServiceAccount needs the ClusterRole of deploy/ipledger.yaml)", what, err)
	default:
		// Connection refused or reset, timeouts, 429 and 5xx: the server did not
		// answer, and the write may or may not have been applied.
		sentinel = datastore.ErrUnavailable
	}
	return fmt.Errorf("%s: %w: %w", what, sentinel, err)
}

// Namespace is where the store keeps node Leases.
func (s *Store) Namespace() string { return s.ns }
