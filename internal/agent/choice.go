package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/choice"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/ledger"
)

// WhyDefault is the reason recorded with a lease whose addresses came from the
// network's own ranges, as no annotation chose otherwise.
const WhyDefault = "default pool"

// Choices reads the address-choice annotations (choice.Pool, choice.IP) of a pod
// and of a namespace, only those present. An error means the API could not be
// asked: the ADD fails (the runtime retries) rather than ignore a choice. A pod or
// namespace the API does not have has none. NodeLabels are this node's labels, for
// an IPPool's node selector (an error: unknown, and a pool with a selector is not
// served). kubenode.Pods is one.
type Choices interface {
	Choices(ctx context.Context, namespace, name, uid string) (map[string]string, error)
	NamespaceChoices(ctx context.Context, namespace string) (map[string]string, error)
	NodeLabels(ctx context.Context) (map[string]string, error)
}

// Pod Event reason of a refused address choice.
const (
	ReasonAddressChoiceRefused = "AddressChoiceRefused"
	actionAllocate             = "Allocate"
)

// choiceMade is what the annotations of an ADD's pod chose.
type choiceMade struct {
	want    []netip.Addr
	why     string
	ipFrom  choice.Source // where ipledger.io/ip was found
	ipValue string
	// pool is the named pool chosen by ipledger.io/pool (cluster mode), set up
	// on this node; nil: the network's own ranges
	pool *cluster.IPPool
}

// choose reads the pod's and its namespace's annotations: nil when there is nothing
// to read or nothing chosen. A choice that cannot be honoured (an annotation that
// does not parse, a pool this agent cannot serve) is refused with an error naming
// the annotation and the fix, and the same note as an Event on the pod.
func (s *Server) choose(ctx context.Context, pod api.Pod) (*choiceMade, *api.Error) {
	c := s.cfg.Choices
	if c == nil || pod.Namespace == "" || pod.Name == "" {
		return nil, nil
	}
	podAnn, err := c.Choices(ctx, pod.Namespace, pod.Name, pod.UID)
	if err != nil {
		return nil, &api.Error{Code: api.CodeUnavailable, Msg: fmt.Sprintf("reading the address annotations of pod %s/%s: %v", pod.Namespace, pod.Name, err)}
	}
	poolValue, hasPool := podAnn[choice.Pool]
	poolFrom := choice.PodSource(pod.Namespace, pod.Name)
	if !hasPool {
		nsAnn, err := c.NamespaceChoices(ctx, pod.Namespace)
		if err != nil {
			return nil, &api.Error{Code: api.CodeUnavailable, Msg: fmt.Sprintf("reading the address annotations of namespace %s: %v", pod.Namespace, err)}
		}
		poolValue, hasPool = nsAnn[choice.Pool]
		poolFrom = choice.NamespaceSource(pod.Namespace)
	}
	if hasPool {
		name, err := choice.ParsePool(poolValue, poolFrom)
		if err != nil {
			return nil, s.refuseChoice(pod, err.Error())
		}
		if s.cfg.Cluster == nil {
			return nil, s.refuseChoice(pod, fmt.Sprintf("%s on %s asks for pool %q: named pools exist only in cluster mode (ipledgerd --datastore); this agent runs in node mode, where the node's podCIDR is the only range; remove the annotation", choice.Pool, poolFrom, name))
		}
		p, err := s.cfg.Cluster.EnsurePool(ctx, name, c.NodeLabels)
		switch {
		case errors.Is(err, cluster.ErrNoPool) || errors.Is(err, cluster.ErrPoolNotForNode) || errors.Is(err, cluster.ErrBadPool) ||
			errors.Is(err, cluster.ErrPoolMismatch) || errors.Is(err, ledger.ErrPoolConflict):
			return nil, s.refuseChoice(pod, fmt.Sprintf("%s on %s asks for pool %q: %v; or remove the annotation for the default pool", choice.Pool, poolFrom, name, err))
		case err != nil:
			return nil, &api.Error{Code: api.CodeUnavailable, Msg: fmt.Sprintf("%s on %s asks for pool %q: %v", choice.Pool, poolFrom, name, err)}
		}
		made := &choiceMade{pool: &p, why: fmt.Sprintf("pool %s (annotation %s on %s)", name, choice.Pool, poolFrom)}
		return s.chooseIP(pod, podAnn, made)
	}
	return s.chooseIP(pod, podAnn, nil)
}

// chooseIP adds the pod's ipledger.io/ip to made (nil: nothing chosen yet).
func (s *Server) chooseIP(pod api.Pod, podAnn map[string]string, made *choiceMade) (*choiceMade, *api.Error) {
	ipValue, hasIP := podAnn[choice.IP]
	if !hasIP {
		return made, nil
	}
	src := choice.PodSource(pod.Namespace, pod.Name)
	want, err := choice.ParseIP(ipValue, src)
	if err != nil {
		return nil, s.refuseChoice(pod, err.Error())
	}
	if made == nil {
		return &choiceMade{want: want, why: "requested by " + choice.IP, ipFrom: src, ipValue: ipValue}, nil
	}
	made.want, made.ipFrom, made.ipValue = want, src, ipValue
	made.why += ", requested by " + choice.IP
	return made, nil
}

// applyChoice puts what the annotations chose into an ADD's allocation.
func (c *choiceMade) applyChoice(areq *ledger.AllocateRequest) {
	areq.Want, areq.Why = c.want, c.why
	if c.pool != nil {
		areq.Pool, areq.Ranges, areq.ReplaceRanges = c.pool.Name, c.pool.Ranges, false
	}
}

// refuseChoice is the answer to an ADD whose address choice cannot be honoured:
// the runtime's CNI error (invalid network config, the message naming the
// annotation and the fix) and a Warning Event on the pod saying the same.
func (s *Server) refuseChoice(pod api.Pod, msg string) *api.Error {
	if s.cfg.Events != nil {
		s.cfg.Events.PodEvent(pod.Namespace, pod.Name, pod.UID, "Warning", ReasonAddressChoiceRefused, actionAllocate, msg)
	}
	return &api.Error{Code: api.CodeInvalid, Msg: msg}
}

// excludeOf reads an ADD's ipam.exclude (the plugin checked it; a request from
// elsewhere is checked again).
func excludeOf(ex []string) ([]netip.Prefix, *api.Error) {
	if len(ex) > api.MaxExclude {
		return nil, &api.Error{Code: api.CodeInvalid, Msg: fmt.Sprintf("ipam.exclude: %d entries; at most %d", len(ex), api.MaxExclude)}
	}
	var out []netip.Prefix
	for i, s := range ex {
		p, err := api.ParseExclude(s)
		if err != nil {
			return nil, &api.Error{Code: api.CodeInvalid, Msg: fmt.Sprintf("ipam.exclude[%d]: %v", i, err)}
		}
		out = append(out, p)
	}
	return out, nil
}
