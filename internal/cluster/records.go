package cluster

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/pool"
)

// Default block sizes: 64 addresses per block in either family.
const (
	DefaultBlockBits4 = 26
	DefaultBlockBits6 = 122
)

// BlockBits returns the block prefix length of every range set of ranges for the
// IPAM config key blockSize: 0 takes the defaults (/26 for IPv4, /122 for IPv6); a
// value up to 32 is the IPv4 prefix length and gives IPv6 range sets blocks of as
// many addresses (blockSize+96); a value above 32 is an IPv6 prefix length (the pool
// must then have no IPv4 range set). Each size is checked against its range set.
func BlockBits(ranges []pool.RangeSet, blockSize int) ([]int, error) {
	if blockSize < 0 || blockSize > 128 {
		return nil, fmt.Errorf("%w: blockSize: %d is not a prefix length; give e.g. 26 (IPv4 /26, IPv6 /122) or leave it out", pool.ErrInvalidRange, blockSize)
	}
	out := make([]int, len(ranges))
	for i, set := range ranges {
		if len(set) == 0 {
			return nil, fmt.Errorf("%w: ranges[%d]: empty range set", pool.ErrInvalidRange, i)
		}
		v4 := set[0].Subnet.Addr().Is4()
		switch {
		case blockSize == 0 && v4:
			out[i] = DefaultBlockBits4
		case blockSize == 0:
			out[i] = DefaultBlockBits6
		case blockSize <= 32 && v4:
			out[i] = blockSize
		case blockSize <= 32:
			out[i] = blockSize + 96
		case v4:
			return nil, fmt.Errorf("%w: blockSize: %d is an IPv6 prefix length but ranges[%d] is IPv4; give the IPv4 prefix length (IPv6 blocks get as many addresses)", pool.ErrInvalidRange, blockSize, i)
		default:
			out[i] = blockSize
		}
		if err := set.CheckBlockBits(out[i], "blockSize"); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// PoolRecord is the datastore record "pools/<network>": a network's cluster-wide
// ranges and block sizes, created once by the first node; every node must use the
// same.
type PoolRecord struct {
	Network   string          `json:"network"`
	Ranges    []pool.RangeSet `json:"ranges"`
	BlockBits []int           `json:"blockBits"`
	// Drained are ranges an operator took out of a network's default pool: a
	// node's conflist that still lists one does not add it back (extend).
	Drained []pool.Range `json:"drained,omitempty"`
}

func (p PoolRecord) equal(o PoolRecord) bool {
	return p.Network == o.Network && pool.Equal(p.Ranges, o.Ranges) && slices.Equal(p.BlockBits, o.BlockBits) && slices.Equal(p.Drained, o.Drained)
}

// covers: every range of conf is in p's range set of the same index (or drained),
// with the same block sizes: a node with conflist conf serves p unchanged.
func (p PoolRecord) covers(conf PoolRecord) bool {
	if !slices.Equal(p.BlockBits, conf.BlockBits) || len(p.Ranges) != len(conf.Ranges) {
		return false
	}
	for i, set := range conf.Ranges {
		for _, r := range set {
			if !slices.Contains(p.Ranges[i], r) && !slices.Contains(p.Drained, r) {
				return false
			}
		}
	}
	return true
}

// extend returns p with conf's ranges it lacks added to their range sets (those
// p lists drained left out). A conflist of other block sizes, or another number
// or family of range sets, is refused (ErrPoolMismatch): every node must agree.
func (p PoolRecord) extend(conf PoolRecord) (PoolRecord, error) {
	mismatch := func() error {
		return fmt.Errorf("%w: network %q: the cluster's pool has ranges %v with blocks /%v, this node's config has ranges %v with blocks /%v; every node must use the same blockSize and the same range sets (families) for a network name, and may add ranges to a set (fix this node's config, or use another network name)",
			ErrPoolMismatch, p.Network, pool.SetsString(p.Ranges), p.BlockBits, pool.SetsString(conf.Ranges), conf.BlockBits)
	}
	if !slices.Equal(p.BlockBits, conf.BlockBits) || len(p.Ranges) != len(conf.Ranges) {
		return PoolRecord{}, mismatch()
	}
	out := PoolRecord{Network: p.Network, BlockBits: p.BlockBits, Drained: p.Drained, Ranges: make([]pool.RangeSet, len(p.Ranges))}
	for i, set := range p.Ranges {
		if set[0].Subnet.Addr().BitLen() != conf.Ranges[i][0].Subnet.Addr().BitLen() {
			return PoolRecord{}, mismatch()
		}
		out.Ranges[i] = slices.Clone(set)
		for _, r := range conf.Ranges[i] {
			if !slices.Contains(set, r) && !slices.Contains(p.Drained, r) {
				out.Ranges[i] = append(out.Ranges[i], r)
			}
		}
	}
	return out, nil
}

// BlockRecord is the datastore record "blocks/<network>/<block>": who owns a block
// of a network's pool, at which epoch. Owner "" is a free block. Every change of
// owner bumps the epoch (by compare-and-swap), so an agent that lost a block while it
// could not prove its lease sees that the epoch moved.
type BlockRecord struct {
	Network string       `json:"network"`
	CIDR    netip.Prefix `json:"cidr"`
	Set     int          `json:"set"`
	Owner   string       `json:"owner"`            // node name, "" when free
	Holder  string       `json:"holder,omitempty"` // the owner's agent that last wrote it
	Epoch   uint64       `json:"epoch"`
	Lease   string       `json:"lease,omitempty"` // the owner's node lease (its ID) when it wrote it
	// Borrows are the block's addresses kept for a StatefulSet pod (Keep), each
	// lent to the node the pod runs on now, if another (Borrow): one
	// compare-and-swap on this record takes an address, so two nodes racing for
	// it cannot both win, and a record rewritten for its owner keeps them. In
	// address order.
	Borrows []Borrow `json:"borrows,omitempty"`
}

// Borrow is one address of a block kept for a StatefulSet pod, and the node it is
// lent to. The block's owner never hands it out (the ledger withholds it) nor
// gives the block back while it keeps one.
type Borrow struct {
	Addr netip.Addr `json:"addr"`
	// For is the pod the address is kept for: "namespace/statefulset/pod".
	For string `json:"for"`
	// Node is the node that holds it (its pod runs there: a borrower, or the
	// block's owner itself), "" while no pod holds it; Holder and Lease are that
	// node's agent and node lease when it took it.
	Node   string `json:"node,omitempty"`
	Holder string `json:"holder,omitempty"`
	Lease  string `json:"lease,omitempty"`
}

// equal: the records are the same (Borrows compared by value).
func (b BlockRecord) equal(o BlockRecord) bool {
	return b.Network == o.Network && b.CIDR == o.CIDR && b.Set == o.Set && b.Owner == o.Owner &&
		b.Holder == o.Holder && b.Epoch == o.Epoch && b.Lease == o.Lease && slices.Equal(b.Borrows, o.Borrows)
}

// borrowIndex is the index of addr in Borrows, or -1.
func (b BlockRecord) borrowIndex(addr netip.Addr) int {
	return slices.IndexFunc(b.Borrows, func(x Borrow) bool { return x.Addr == addr })
}

// kept is the addresses of Borrows, in order.
func (b BlockRecord) kept() []netip.Addr {
	out := make([]netip.Addr, 0, len(b.Borrows))
	for _, x := range b.Borrows {
		out = append(out, x.Addr)
	}
	return out
}

// Keys of the records.
const (
	poolsKind  = "pools/"
	blocksKind = "blocks/"
)

// EncodeName makes s a datastore name part: bytes of [a-z0-9-] stay, every other
// byte becomes '.' and two hex digits (so names stay distinct and reversible).
func EncodeName(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, ".%02x", c)
		}
	}
	return b.String()
}

// BlockName is a block's name part: its CIDR with '.', ':' and '/' written as '-'
// (10.0.0.64/26 is 10-0-0-64-26, fd00::40/122 is fd00--40-122).
func BlockName(p netip.Prefix) string {
	return strings.NewReplacer(".", "-", ":", "-", "/", "-").Replace(p.String())
}

// PoolKey is the key of network's pool record.
func PoolKey(network string) string { return poolsKind + EncodeName(network) }

// BlocksPrefix is the key prefix of network's blocks ("" lists every network's).
func BlocksPrefix(network string) string {
	if network == "" {
		return blocksKind
	}
	return blocksKind + EncodeName(network) + "/"
}

// BlockKey is the key of a block record.
func BlockKey(network string, p netip.Prefix) string { return BlocksPrefix(network) + BlockName(p) }

func decodeBlock(kv datastore.KV) (BlockRecord, error) {
	var b BlockRecord
	if err := json.Unmarshal(kv.Value, &b); err != nil {
		return b, fmt.Errorf("datastore record %s: %v", kv.Key, err)
	}
	if !b.CIDR.IsValid() || BlockKey(b.Network, b.CIDR) != kv.Key {
		return b, fmt.Errorf("datastore record %s: holds block %q of %q, not the key's", kv.Key, b.CIDR, b.Network)
	}
	return b, nil
}
