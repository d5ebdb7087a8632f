package kubeds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/ipledger/ipledger/internal/datastore"
)

// leases are node Leases (coordination.k8s.io/v1) named ipledger-<node> in the
// store's namespace. Kubernetes never expires a Lease: observers judge expiry by the
// revision not changing for the TTL (the datastore.Leases contract).
type leases struct{ s *Store }

var _ datastore.Leases = (*leases)(nil)

func (l *leases) res() dynamic.ResourceInterface {
	return l.s.client.Resource(leaseGVR).Namespace(l.s.ns)
}

// ttlSeconds is ttl in whole seconds (datastore.CheckNode allows no other).
func ttlSeconds(ttl time.Duration) int64 { return int64(ttl / time.Second) }

func (l *leases) now() string { return l.s.clock.Now().UTC().Format(metav1.RFC3339Micro) }

// Acquire creates node's Lease for holder, or takes it over (whoever held it).
func (l *leases) Acquire(ctx context.Context, node, holder string, ttl time.Duration, addrs ...netip.Addr) (datastore.NodeLease, error) {
	if err := datastore.CheckNode(node, holder, ttl); err != nil {
		return datastore.NodeLease{}, fmt.Errorf("kubeds: %w", err)
	}
	if err := datastore.CheckAddrs(node, addrs); err != nil {
		return datastore.NodeLease{}, fmt.Errorf("kubeds: %w", err)
	}
	secs := ttlSeconds(ttl)
	if err := ctxDone(ctx, "acquire lease of node", node); err != nil {
		return datastore.NodeLease{}, err
	}
	name := leaseName(node)
	what, obj := "acquire lease", l.s.ns+"/"+name
	// A takeover is a read and a CAS write; retried while other writers race it.
	var last error
	for attempt := 0; attempt < 8; attempt++ {
		now := l.now()
		cur, err := l.res().Get(ctx, name, metav1.GetOptions{})
		switch {
		case err == nil:
			spec, _, _ := unstructured.NestedMap(cur.Object, "spec")
			if spec == nil {
				spec = map[string]any{}
			}
			transitions, _, _ := unstructured.NestedInt64(cur.Object, "spec", "leaseTransitions")
			if h, _, _ := unstructured.NestedString(cur.Object, "spec", "holderIdentity"); h != holder {
				transitions++
			}
			spec["holderIdentity"] = holder
			spec["leaseDurationSeconds"] = secs
			spec["acquireTime"] = now
			spec["renewTime"] = now
			spec["leaseTransitions"] = transitions
			cur.Object["spec"] = spec
			setLeaseMeta(cur, node, addrs)
			out, err := l.res().Update(ctx, cur, metav1.UpdateOptions{})
			if err == nil {
				return toNodeLease(out)
			}
			last = mapErr(ctx, what, obj, err)
		case errors.Is(mapErr(ctx, what, obj, err), datastore.ErrNotFound):
			lease := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "coordination.k8s.io/v1",
				"kind":       "Lease",
				"spec": map[string]any{
					"holderIdentity": holder, "leaseDurationSeconds": secs,
					"acquireTime": now, "renewTime": now, "leaseTransitions": int64(0),
				},
			}}
			lease.SetName(name)
			lease.SetNamespace(l.s.ns)
			setLeaseMeta(lease, node, addrs)
			out, err := l.res().Create(ctx, lease, metav1.CreateOptions{})
			if err == nil {
				return toNodeLease(out)
			}
			last = mapErr(ctx, what, obj, err)
		default:
			return datastore.NodeLease{}, mapErr(ctx, what, obj, err)
		}
		if !errors.Is(last, datastore.ErrConflict) && !errors.Is(last, datastore.ErrExists) && !errors.Is(last, datastore.ErrNotFound) {
			return datastore.NodeLease{}, last
		}
	}
	return datastore.NodeLease{}, fmt.Errorf("kubeds: %s %s: still racing other writers after 8 attempts: %w", what, obj, last)
}

func setLeaseMeta(obj *unstructured.Unstructured, node string, addrs []netip.Addr) {
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelNode] = labelValue(node)
	obj.SetLabels(labels)
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[AnnotationNode] = node
	delete(ann, AnnotationAddrs)
	if len(addrs) > 0 {
		s := make([]string, len(addrs))
		for i, a := range addrs {
			s[i] = a.String()
		}
		ann[AnnotationAddrs] = strings.Join(s, ",")
	}
	obj.SetAnnotations(ann)
}

// Renew rewrites the lease if nobody wrote it since lease was read: a merge patch
// carrying the resourceVersion and UID (the apiserver refuses it with a conflict
// otherwise).
func (l *leases) Renew(ctx context.Context, lease datastore.NodeLease) (datastore.NodeLease, error) {
	if err := datastore.CheckNode(lease.Node, lease.Holder, lease.TTL); err != nil {
		return datastore.NodeLease{}, fmt.Errorf("kubeds: renew: %w", err)
	}
	secs := ttlSeconds(lease.TTL)
	if err := ctxDone(ctx, "renew lease of node", lease.Node); err != nil {
		return datastore.NodeLease{}, err
	}
	if lease.Revision <= 0 || lease.ID == "" {
		return datastore.NodeLease{}, fmt.Errorf("kubeds: renew lease of node %s: %w: no revision or ID (renew what Acquire returned)", lease.Node, datastore.ErrInvalid)
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{
			"resourceVersion": strconv.FormatInt(lease.Revision, 10),
			"uid":             lease.ID,
			// A patch that changes nothing keeps the resourceVersion; this always changes.
			"annotations": map[string]string{AnnotationSeq: strconv.FormatInt(lease.Revision, 10)},
		},
		"spec": map[string]any{
			"holderIdentity":       lease.Holder,
			"leaseDurationSeconds": secs,
			"renewTime":            l.now(),
		},
	})
	if err != nil {
		return datastore.NodeLease{}, err
	}
	name := leaseName(lease.Node)
	out, err := l.res().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return datastore.NodeLease{}, mapErr(ctx, "renew lease", name, err)
	}
	return toNodeLease(out)
}

// Release deletes the lease if it is still the one given (revision and UID).
func (l *leases) Release(ctx context.Context, lease datastore.NodeLease) error {
	if err := datastore.CheckNode(lease.Node, lease.Holder, lease.TTL); err != nil {
		return fmt.Errorf("kubeds: release: %w", err)
	}
	if lease.Revision <= 0 {
		return fmt.Errorf("kubeds: release lease of node %s: %w: no revision (release what Acquire or Renew returned)", lease.Node, datastore.ErrInvalid)
	}
	if err := ctxDone(ctx, "release lease of node", lease.Node); err != nil {
		return err
	}
	rv := strconv.FormatInt(lease.Revision, 10)
	pre := &metav1.Preconditions{ResourceVersion: &rv}
	if lease.ID != "" {
		uid := types.UID(lease.ID)
		pre.UID = &uid
	}
	name := leaseName(lease.Node)
	err := l.res().Delete(ctx, name, metav1.DeleteOptions{Preconditions: pre})
	return mapErr(ctx, "release lease", name, err)
}

// List returns every node's Lease (those labelled ipledger.io/node), by node.
func (l *leases) List(ctx context.Context) ([]datastore.NodeLease, error) {
	if err := ctxDone(ctx, "list leases in", l.s.ns); err != nil {
		return nil, err
	}
	list, err := l.res().List(ctx, metav1.ListOptions{LabelSelector: LabelNode})
	if err != nil {
		return nil, mapErr(ctx, "list leases in", l.s.ns, err)
	}
	out := make([]datastore.NodeLease, 0, len(list.Items))
	for i := range list.Items {
		if _, ok := list.Items[i].GetAnnotations()[AnnotationNode]; !ok {
			continue // labelled by hand, not written by ipledger: no node's lease
		}
		nl, err := toNodeLease(&list.Items[i])
		if err != nil {
			return nil, err
		}
		out = append(out, nl)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}

func toNodeLease(obj *unstructured.Unstructured) (datastore.NodeLease, error) {
	node, ok := obj.GetAnnotations()[AnnotationNode]
	if !ok {
		return datastore.NodeLease{}, fmt.Errorf("kubeds: Lease %s/%s has no %s annotation: not written by ipledger", obj.GetNamespace(), obj.GetName(), AnnotationNode)
	}
	rev, err := revision(obj)
	if err != nil {
		return datastore.NodeLease{}, err
	}
	holder, _, _ := unstructured.NestedString(obj.Object, "spec", "holderIdentity")
	secs, _, _ := unstructured.NestedInt64(obj.Object, "spec", "leaseDurationSeconds")
	var addrs []netip.Addr
	if v := obj.GetAnnotations()[AnnotationAddrs]; v != "" {
		for _, f := range strings.Split(v, ",") {
			a, err := netip.ParseAddr(f)
			if err != nil {
				return datastore.NodeLease{}, fmt.Errorf("kubeds: Lease %s/%s: annotation %s: %v", obj.GetNamespace(), obj.GetName(), AnnotationAddrs, err)
			}
			addrs = append(addrs, a)
		}
	}
	return datastore.NodeLease{Node: node, Holder: holder, TTL: time.Duration(secs) * time.Second, Revision: rev, ID: string(obj.GetUID()), Addrs: addrs}, nil
}
