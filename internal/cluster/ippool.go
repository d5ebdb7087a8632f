package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/pool"
)

// IPPool is a named pool: an operator's IPPool object (the record "pools/<name>",
// whose spec has no network), chosen for a pod by the annotation ipledger.io/pool.
// It is set up on a node exactly as a network's pool is (EnsureNetwork): its name
// is its ledger pool and the network part of its block records, so its blocks are
// claimed, routed, given back and reclaimed by the same code. A network's own
// record names its network; a pool name and a network name share the key space,
// so the two can never both hold one name (EnsureNetwork refuses a network named
// like an IPPool).
type IPPool struct {
	Name      string
	Ranges    []pool.RangeSet
	BlockBits []int
	// NodeSelector: only nodes whose labels hold every pair claim its blocks;
	// empty: every node.
	NodeSelector map[string]string
}

// ipPoolSpec is the JSON of an IPPool's spec as the operator writes it.
type ipPoolSpec struct {
	Network      string            `json:"network,omitempty"`
	Ranges       json.RawMessage   `json:"ranges"`
	BlockSize    int               `json:"blockSize,omitempty"`
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
}

// ParseIPPool reads the spec of IPPool name (a datastore value). An error wraps
// ErrBadPool and names the field and the fix.
func ParseIPPool(name string, value []byte) (IPPool, error) {
	if err := checkPoolName(name); err != nil {
		return IPPool{}, err
	}
	var spec ipPoolSpec
	if err := json.Unmarshal(value, &spec); err != nil {
		return IPPool{}, fmt.Errorf("%w: IPPool %s: spec: %v", ErrBadPool, name, err)
	}
	if spec.Network != "" {
		return IPPool{}, fmt.Errorf("%w: IPPool %s is the default pool of CNI network %q (written by the agents from its conflist), not a named pool; create an IPPool of another name", ErrBadPool, name, spec.Network)
	}
	if len(spec.Ranges) == 0 || string(spec.Ranges) == "null" {
		return IPPool{}, fmt.Errorf("%w: IPPool %s: spec.ranges is missing; give e.g. ranges: [[{subnet: 10.50.0.0/16}]]", ErrBadPool, name)
	}
	ranges, err := pool.ParseRangeSets(spec.Ranges)
	if err != nil {
		return IPPool{}, fmt.Errorf("%w: IPPool %s: spec: %v", ErrBadPool, name, err)
	}
	if pool.HasPodCIDR(ranges) {
		return IPPool{}, fmt.Errorf("%w: IPPool %s: spec.ranges: usePodCidr stands for a node's podCIDR, which only the conflist's default pool can use; give the pool's own subnets", ErrBadPool, name)
	}
	bits, err := BlockBits(ranges, spec.BlockSize)
	if err != nil {
		return IPPool{}, fmt.Errorf("%w: IPPool %s: spec: %v", ErrBadPool, name, err)
	}
	for k := range spec.NodeSelector {
		if k == "" {
			return IPPool{}, fmt.Errorf("%w: IPPool %s: spec.nodeSelector has an empty label key", ErrBadPool, name)
		}
	}
	return IPPool{Name: name, Ranges: ranges, BlockBits: bits, NodeSelector: spec.NodeSelector}, nil
}

// MarshalIPPool is the datastore value of p (the IPPool object's spec), with
// blockSize given as the IPv4 prefix length (or the IPv6 one of an IPv6-only pool).
func MarshalIPPool(p IPPool, blockSize int) ([]byte, error) {
	raw, err := json.Marshal(p.Ranges)
	if err != nil {
		return nil, err
	}
	return json.Marshal(ipPoolSpec{Ranges: raw, BlockSize: blockSize, NodeSelector: p.NodeSelector})
}

// checkPoolName: an IPPool's name is a DNS label (a Kubernetes object name without
// dots), so that it is its own datastore name and a valid ledger pool name.
func checkPoolName(name string) error {
	if name == "" || len(name) > 63 || name[0] == '-' || name[len(name)-1] == '-' {
		return fmt.Errorf("%w: pool name %q: want a DNS label (1 to 63 of [a-z0-9-], starting and ending with a letter or digit)", ErrBadPool, name)
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("%w: pool name %q: want a DNS label (1 to 63 of [a-z0-9-], starting and ending with a letter or digit)", ErrBadPool, name)
		}
	}
	return nil
}

// Selects reports whether a node with labels may use the pool.
func (p IPPool) Selects(labels map[string]string) bool {
	for k, v := range p.NodeSelector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// NodeLabels returns this node's labels (its Node object's); an error means they
// could not be read. EnsurePool asks only for a pool with a node selector.
type NodeLabels func(ctx context.Context) (map[string]string, error)

// EnsurePool sets IPPool name up on this node for an ADD and returns it: its record
// is read (one GET, so a pool created, changed or deleted a moment ago counts), the
// node selector is checked against the node's labels, and the pool is set up as a
// network of its own (EnsureNetwork: the ledger's cluster-scoped pool, blocks the
// datastore gives the node adopted). Errors: ErrNoPool when no IPPool has the name,
// ErrPoolNotForNode when the node's labels do not match its selector, ErrBadPool
// for a spec that cannot be used, ErrPoolMismatch when the pool's ranges or block
// size changed since the node set it up. When the datastore cannot be reached, a
// pool this node has set up is served as it was.
func (m *Manager) EnsurePool(ctx context.Context, name string, labels NodeLabels) (IPPool, error) {
	if err := checkPoolName(name); err != nil {
		return IPPool{}, err
	}
	// the watched copy when it has listed since the start and its watch runs,
	// else one GET: a pool created, changed or deleted a moment ago counts
	kv, found, live := m.poolCopy.get(PoolKey(name))
	var err error
	switch {
	case live && !found:
		err = datastore.ErrNotFound
	case !live:
		err = m.call(ctx, func(ctx context.Context) (err error) {
			kv, err = m.ds.Get(ctx, PoolKey(name))
			return err
		})
		m.note(err)
	}
	var p IPPool
	switch {
	case errors.Is(err, datastore.ErrNotFound):
		return IPPool{}, fmt.Errorf("%w: no IPPool named %q exists; create it (kubectl apply an IPPool with spec.ranges), or choose another pool", ErrNoPool, name)
	case errors.Is(err, datastore.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded):
		m.mu.Lock()
		have, ok := m.pools[name]
		m.mu.Unlock()
		if !ok {
			return IPPool{}, fmt.Errorf("reading IPPool %s: %w", name, err)
		}
		m.log.Warn("datastore unreachable; serving the pool as it was set up", "pool", name, "err", err)
		p = have
	case err != nil:
		return IPPool{}, fmt.Errorf("reading IPPool %s: %w", name, err)
	default:
		if p, err = ParseIPPool(name, kv.Value); err != nil {
			m.mu.Lock()
			have, ok := m.pools[name]
			m.mu.Unlock()
			if !ok {
				return IPPool{}, err
			}
			// a spec that no longer parses changes nothing: served as it was
			m.setRefused(name, err)
			p = have
		}
	}
	if len(p.NodeSelector) > 0 {
		if labels == nil {
			return IPPool{}, fmt.Errorf("%w: IPPool %s selects nodes by %s, and this agent cannot read its Node's labels (run it with --node-name and API access)", ErrPoolNotForNode, name, labelString(p.NodeSelector))
		}
		got, err := labels(ctx)
		if err != nil {
			return IPPool{}, fmt.Errorf("reading the labels of node %s for IPPool %s's node selector: %w", m.opts.Node, name, err)
		}
		if !p.Selects(got) {
			return IPPool{}, fmt.Errorf("%w: IPPool %s selects nodes labelled %s; node %s is not one (its labels: %s); schedule the pod on a selected node, or widen the pool's nodeSelector", ErrPoolNotForNode, name, labelString(p.NodeSelector), m.opts.Node, labelString(got))
		}
	}
	served, err := m.ensureNamed(ctx, p)
	if err != nil {
		return IPPool{}, err
	}
	return served, nil
}

// ensureNamed sets p up as a network of its own (the ledger pool and the node's
// books, never the record: the operator's), or, when the node serves it already
// with other ranges, follows the change (followRecord); it returns the pool as the
// node serves it: a change refused as bad input leaves it as it was.
func (m *Manager) ensureNamed(ctx context.Context, p IPPool) (IPPool, error) {
	want := PoolRecord{Network: p.Name, Ranges: p.Ranges, BlockBits: p.BlockBits}
	m.mu.Lock()
	_, ok := m.nets[p.Name]
	m.mu.Unlock()
	if ok {
		if err := m.followRecord(ctx, p.Name, want, &p); err != nil && !errors.Is(err, ErrBadPool) {
			return IPPool{}, err
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.pools[p.Name], nil
	}
	if err := m.firstSetUp(ctx, p, want); err != nil {
		return IPPool{}, fmt.Errorf("IPPool %s: %w", p.Name, err)
	}
	return p, nil
}

// firstSetUp refuses a named pool whose block records have another size than its
// spec (the spec's blockSize changed under blocks), then sets it up.
func (m *Manager) firstSetUp(ctx context.Context, p IPPool, want PoolRecord) error {
	blocks, cached := m.cachedBlocks(p.Name)
	if !cached {
		m.claimMu.Lock()
		var err error
		blocks, err = m.relist(ctx, p.Name)
		m.claimMu.Unlock()
		if err != nil {
			return err
		}
	}
	for _, b := range blocks {
		if b.err == nil && b.rec.Set < len(want.BlockBits) && b.rec.CIDR.Bits() != want.BlockBits[b.rec.Set] {
			return fmt.Errorf("%w: IPPool %s: spec.blockSize: blocks of /%v, the pool's blocks are /%d (block %s); a pool with blocks keeps its block size: restore blockSize, or create another IPPool with the new size",
				ErrBadPool, p.Name, want.BlockBits, b.rec.CIDR.Bits(), b.rec.CIDR)
		}
	}
	if err := m.setUp(ctx, p.Name, want); err != nil {
		return err
	}
	m.mu.Lock()
	m.pools[p.Name] = p
	m.mu.Unlock()
	return nil
}

func labelString(l map[string]string) string {
	if len(l) == 0 {
		return "none"
	}
	keys := slices.Sorted(maps.Keys(l))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+l[k])
	}
	return strings.Join(parts, ",")
}
