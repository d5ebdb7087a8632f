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
	// AnnotationAddrs holds the addresses published with a Lease, comma-separated
	// (absent: none).
	AnnotationAddrs = "ipledger.io/addresses"
)

// kind is where records of one datastore kind are stored: pools/, blocks/ and
// reservations/ have their own resources, every other kind shares IPRecord, told
// apart by a label.
type kind struct {
	name    string // "pools", "blocks", "reservations"; "" for the shared IPRecord resource
	gvr     schema.GroupVersionResource
	objKind string // "IPPool"
	// operator: an operator writes objects of this kind (kubectl apply): one
	// without the key annotation is the record "<name>/<object name>"
	operator bool
}

var (
	poolKind = &kind{name: "pools", objKind: "IPPool", operator: true,
		gvr: schema.GroupVersionResource{Group: Group, Version: Version, Resource: "ippools"}}
	reservationKind = &kind{name: "reservations", objKind: "IPReservation", operator: true,
		gvr: schema.GroupVersionResource{Group: Group, Version: Version, Resource: "ipreservations"}}
	blockKind = &kind{name: "blocks", objKind: "IPBlock",
		gvr: schema.GroupVersionResource{Group: Group, Version: Version, Resource: "ipblocks"}}
	recordKind = &kind{objKind: "IPRecord",
		gvr: schema.GroupVersionResource{Group: Group, Version: Version, Resource: "iprecords"}}

	leaseGVR = schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
)

// LabelKind holds the datastore kind of an IPRecord.
const LabelKind = "ipledger.io/kind"

func kindOf(name string) *kind {
	switch name {
	case poolKind.name:
		return poolKind
	case blockKind.name:
		return blockKind
	case reservationKind.name:
		return reservationKind
	}
	return recordKind
}

// objRef is where one key lives.
type objRef struct {
	kind    *kind
	kindArg string // the key's kind
	network string // the name's first segment
	name    string // object name
}

// labels are the labels of the key's object: its first name segment (the network)
// and, in the shared IPRecord resource, its kind.
func (r objRef) labels() map[string]string {
	l := map[string]string{LabelNetwork: labelValue(r.network)}
	if r.kind == recordKind {
		l[LabelKind] = labelValue(r.kindArg)
	}
	return l
}

// parseKey maps a datastore key (checked by datastore.CheckKey) to its object.
// Names: "pools/N" is the IPPool N; "reservations/N" the IPReservation N;
// "blocks/N/B" is the IPBlock "N.B". Any other
// key, and any of those whose readable name is not a valid object name (N holds a
// dot, so the split would be ambiguous; not a DNS subdomain; other segment counts),
// is named "k" and 40 hex digits of the key's SHA-256: such names hold no dot, the
// readable block names always do, so the mapping stays one-to-one. The key itself is
// in the annotation ipledger.io/key.
func parseKey(key string) (objRef, error) {
	if err := datastore.CheckKey(key); err != nil {
		return objRef{}, fmt.Errorf("kubeds: %w", err)
	}
	kindArg, name, _ := strings.Cut(key, "/")
	segs := strings.Split(name, "/")
	r := objRef{kind: kindOf(kindArg), kindArg: kindArg, network: segs[0]}
	switch {
	case r.kind.operator && len(segs) == 1:
		r.name = segs[0]
	case r.kind == blockKind && len(segs) == 2 && !strings.Contains(segs[0], "."):
		r.name = segs[0] + "." + segs[1]
	}
	if r.name == "" || len(validation.IsDNS1123Subdomain(r.name)) > 0 {
		r.name = hashName("k", key)
	}
	return r, nil
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

// scope is what a List or Watch prefix selects: one resource, narrowed by a label
// selector (kind, first segment), and filtered by key prefix.
type scope struct {
	kind     *kind
	selector string
	prefix   string
}

// parsePrefix maps a List or Watch prefix (checked by datastore.CheckPrefix) to the
// resource its kind lies in.
func parsePrefix(prefix string) (scope, error) {
	if err := datastore.CheckPrefix(prefix); err != nil {
		return scope{}, fmt.Errorf("kubeds: %w", err)
	}
	kindArg, rest, _ := strings.Cut(prefix, "/")
	s := scope{kind: kindOf(kindArg), prefix: prefix}
	var sel []string
	if s.kind == recordKind {
		sel = append(sel, LabelKind+"="+labelValue(kindArg))
	}
	if first, _, ok := strings.Cut(rest, "/"); ok {
		sel = append(sel, LabelNetwork+"="+labelValue(first))
	}
	s.selector = strings.Join(sel, ",")
	return s, nil
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
