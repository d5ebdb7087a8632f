package kubeds

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ipledger/ipledger/internal/datastore"
)

// The API group of ipledger's custom resources and the labels and annotations kubeds
// puts on every object it writes.
const (
	Group   = "ipledger.io"
	Version = "v1alpha1"

	// LabelNetwork holds the record's network (or a hash of it when the name is not a
	// valid label value): the server-side narrowing of List and Watch by network.
	LabelNetwork = "ipledger.io/network"
	// LabelNode marks the node Leases kubeds manages (value: the node, or its hash).
	LabelNode = "ipledger.io/node"
	// AnnotationKey holds the record's datastore key: what makes the object name
	// reversible whatever it had to be shortened to.
	AnnotationKey = "ipledger.io/key"
	// AnnotationNode holds the node of a Lease.
	AnnotationNode = "ipledger.io/node"
	// AnnotationSeq holds the revision an object's last update replaced. It makes
	// every Update a change (the apiserver keeps the resourceVersion of a PUT that
	// changes nothing, while the store's contract is a new revision per write).
	AnnotationSeq = "ipledger.io/seq"
)

// kind is one record kind and the resource it is stored as.
type kind struct {
	prefix   string // "pools/"
	gvr      schema.GroupVersionResource
	objKind  string // "IPPool"
	segments int    // name segments after the kind: 1 for pools/<network>, 2 for blocks/<network>/<block>
}

var (
	poolKind = &kind{prefix: "pools/", objKind: "IPPool", segments: 1,
		gvr: schema.GroupVersionResource{Group: Group, Version: Version, Resource: "ippools"}}
	blockKind = &kind{prefix: "blocks/", objKind: "IPBlock", segments: 2,
		gvr: schema.GroupVersionResource{Group: Group, Version: Version, Resource: "ipblocks"}}
	kinds = []*kind{blockKind, poolKind}

	leaseGVR = schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
)

// objRef is where one key lives.
type objRef struct {
	kind    *kind
	network string
	name    string // object name
}

// parseKey maps a datastore key to its object. Names: "pools/N" is the IPPool N;
// "blocks/N/B" is the IPBlock "N.B". Where that is not a valid object name (N holds a
// dot, so the split would be ambiguous, or the result is not a DNS subdomain or is too
// long) the name is "k" and 40 hex digits of the key's SHA-256: such names hold no
// dot, the readable block names always do, so the mapping stays one-to-one.
func parseKey(key string) (objRef, error) {
	var k *kind
	for _, c := range kinds {
		if strings.HasPrefix(key, c.prefix) {
			k = c
		}
	}
	if k == nil {
		return objRef{}, fmt.Errorf("kubeds: key %q: %w: the kind must be pools/ or blocks/", key, datastore.ErrInvalid)
	}
	segs := strings.Split(strings.TrimPrefix(key, k.prefix), "/")
	if len(segs) != k.segments {
		return objRef{}, fmt.Errorf("kubeds: key %q: %w: want %s followed by %d name(s) separated by /", key, datastore.ErrInvalid, k.prefix, k.segments)
	}
	for _, s := range segs {
		if err := checkName(s); err != nil {
			return objRef{}, fmt.Errorf("kubeds: key %q: %w", key, err)
		}
	}
	r := objRef{kind: k, network: segs[0]}
	switch k {
	case poolKind:
		r.name = segs[0]
	default:
		r.name = segs[0] + "." + segs[1]
		if strings.Contains(segs[0], ".") {
			r.name = ""
		}
	}
	if r.name == "" || len(validation.IsDNS1123Subdomain(r.name)) > 0 {
		r.name = hashName("k", key)
	}
	return r, nil
}

// checkName checks one name segment: 1..MaxName bytes of [a-z0-9.-].
func checkName(s string) error {
	if s == "" || len(s) > datastore.MaxName {
		return fmt.Errorf("%w: name %q must be 1 to %d bytes", datastore.ErrInvalid, s, datastore.MaxName)
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			return fmt.Errorf("%w: name %q holds %q: use only [a-z0-9.-] (encode addresses, e.g. 10-0-0-64-26)", datastore.ErrInvalid, s, c)
		}
	}
	return nil
}

func hashName(prefix, s string) string {
	h := sha256.Sum256([]byte(s))
	return prefix + hex.EncodeToString(h[:20])
}

// labelValue is s when it is a valid label value, else "h_" and a hash of s (an
// underscore never appears in a name, so the two forms cannot meet).
func labelValue(s string) string {
	if len(validation.IsValidLabelValue(s)) == 0 {
		return s
	}
	return hashName("h_", s)
}

// scope is what a List or Watch prefix selects: one kind, narrowed by a label
// selector where the prefix names a whole network, and filtered by key prefix.
type scope struct {
	kind     *kind
	selector string
	prefix   string
}

// parsePrefix maps a List or Watch prefix to the kind it lies in.
func parsePrefix(prefix string) (scope, error) {
	for _, k := range kinds {
		if !strings.HasPrefix(prefix, k.prefix) {
			continue
		}
		s := scope{kind: k, prefix: prefix}
		rest := strings.TrimPrefix(prefix, k.prefix)
		if k.segments > 1 {
			if i := strings.IndexByte(rest, '/'); i > 0 {
				s.selector = LabelNetwork + "=" + labelValue(rest[:i])
			}
		}
		return s, nil
	}
	return scope{}, fmt.Errorf("kubeds: prefix %q: %w: a prefix must start with a kind, pools/ or blocks/ (each kind is its own resource)", prefix, datastore.ErrInvalid)
}

// leaseName is the Lease object of node: "ipledger-<node>", or a hashed form when that
// is not a valid name.
func leaseName(node string) string {
	n := "ipledger-" + node
	if len(validation.IsDNS1123Subdomain(n)) > 0 {
		return hashName("ipledger-h", node)
	}
	return n
}
