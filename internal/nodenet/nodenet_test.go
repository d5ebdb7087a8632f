package nodenet

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func via(dst, gw, node string) Route {
	return Route{Dst: netip.MustParsePrefix(dst), Via: netip.MustParseAddr(gw), Type: Unicast, Node: node}
}

// sameRoute compares routes field by field (Alt is a slice).
func sameRoute(a, b Route) bool {
	return a.Dst == b.Dst && a.Via == b.Via && slices.Equal(a.Alt, b.Alt) && a.Type == b.Type && a.Node == b.Node
}

func unreachable(dst, node string) Route {
	return Route{Dst: netip.MustParsePrefix(dst), Type: Unreachable, Node: node}
}

// problem is what a test expects of a Problem: node, prefix ("" for none), and
// the sentinel its Err wraps.
type problem struct {
	node, prefix string
	err          error
}

// threeNodes: a and b dual-stack, c IPv4 only but with a dual-stack podCIDR.
func threeNodes() []Node {
	return []Node{
		{Name: "a", Addrs: addrs("10.250.0.11", "fd00:250::11"), PodCIDRs: prefixes("10.244.1.0/24", "fd00:244:0:1::/64")},
		{Name: "b", Addrs: addrs("10.250.0.12", "fd00:250::12"), PodCIDRs: prefixes("10.244.2.0/24", "fd00:244:0:2::/64")},
		{Name: "c", Addrs: addrs("10.250.0.13"), PodCIDRs: prefixes("10.244.3.0/24", "fd00:244:0:3::/64")},
	}
}

func TestDesired(t *testing.T) {
	tests := []struct {
		name     string
		self     string
		nodes    []Node
		blocks   []Block
		routes   []Route
		problems []problem
	}{
		{
			name:  "node mode: one route per other node's podCIDR, family by family; own podCIDRs unreachable",
			self:  "a",
			nodes: threeNodes(),
			routes: []Route{
				unreachable("10.244.1.0/24", "a"),
				via("10.244.2.0/24", "10.250.0.12", "b"),
				via("10.244.3.0/24", "10.250.0.13", "c"),
				unreachable("fd00:244:0:1::/64", "a"),
				via("fd00:244:0:2::/64", "fd00:250::12", "b"),
			},
			problems: []problem{{"c", "fd00:244:0:3::/64", ErrNoAddress}},
		},
		{
			name:  "node mode: the node alone needs only its own podCIDRs unreachable",
			self:  "a",
			nodes: threeNodes()[:1],
			routes: []Route{
				unreachable("10.244.1.0/24", "a"),
				unreachable("fd00:244:0:1::/64", "a"),
			},
		},
		{
			name: "node mode: a node without podCIDR is named, self included",
			self: "a",
			nodes: []Node{
				{Name: "a", Addrs: addrs("10.250.0.11")},
				{Name: "b", Addrs: addrs("10.250.0.12"), PodCIDRs: prefixes("10.244.2.0/24")},
				{Name: "c", Addrs: addrs("10.250.0.13")},
			},
			routes:   []Route{via("10.244.2.0/24", "10.250.0.12", "b")},
			problems: []problem{{"a", "", ErrNoPodCIDR}, {"c", "", ErrNoPodCIDR}},
		},
		{
			name: "node mode: usable addresses of the family in the Node's order; unusable ones skipped",
			self: "a",
			nodes: []Node{
				{Name: "a", Addrs: addrs("10.250.0.11"), PodCIDRs: prefixes("10.244.1.0/24")},
				{Name: "b", Addrs: addrs("fe80::1", "127.0.0.1", "::ffff:10.250.0.12", "10.250.0.99", "10.250.0.11", "10.250.0.12", "fd00:250::12"), PodCIDRs: prefixes("10.244.2.0/24", "fd00:244:0:2::/64")},
			},
			routes: []Route{
				unreachable("10.244.1.0/24", "a"),
				{Dst: netip.MustParsePrefix("10.244.2.0/24"), Via: netip.MustParseAddr("10.250.0.12"), Alt: addrs("10.250.0.99"), Type: Unicast, Node: "b"},
				via("fd00:244:0:2::/64", "fd00:250::12", "b"),
			},
		},
		{
			name: "node mode: a peer listing only self's address is no next hop",
			self: "a",
			nodes: []Node{
				{Name: "a", Addrs: addrs("10.250.0.11"), PodCIDRs: prefixes("10.244.1.0/24")},
				{Name: "b", Addrs: addrs("10.250.0.11"), PodCIDRs: prefixes("10.244.2.0/24")},
			},
			routes:   []Route{unreachable("10.244.1.0/24", "a")},
			problems: []problem{{"b", "10.244.2.0/24", ErrBadAddress}},
		},
		{
			name: "node mode: a peer's range overlapping self's gets no route; self keeps its own",
			self: "a",
			nodes: []Node{
				{Name: "a", Addrs: addrs("10.250.0.11"), PodCIDRs: prefixes("10.244.1.0/24")},
				{Name: "b", Addrs: addrs("10.250.0.12"), PodCIDRs: prefixes("10.244.0.0/16")},
				{Name: "c", Addrs: addrs("10.250.0.13"), PodCIDRs: prefixes("10.244.1.128/25", "10.245.0.0/24")},
			},
			routes: []Route{unreachable("10.244.1.0/24", "a"), via("10.245.0.0/24", "10.250.0.13", "c")},
			problems: []problem{
				{"b", "10.244.0.0/16", ErrOverlap},
				{"c", "10.244.1.128/25", ErrOverlap},
			},
		},
		{
			name: "node mode: two peers on the same range: neither routed",
			self: "a",
			nodes: []Node{
				{Name: "a", Addrs: addrs("10.250.0.11"), PodCIDRs: prefixes("10.244.1.0/24")},
				{Name: "b", Addrs: addrs("10.250.0.12"), PodCIDRs: prefixes("10.244.2.0/24")},
				{Name: "c", Addrs: addrs("10.250.0.13"), PodCIDRs: prefixes("10.244.2.0/24", "10.244.3.0/24")},
			},
			routes: []Route{unreachable("10.244.1.0/24", "a"), via("10.244.3.0/24", "10.250.0.13", "c")},
			problems: []problem{
				{"b", "10.244.2.0/24", ErrOverlap},
				{"c", "10.244.2.0/24", ErrOverlap},
			},
		},
		{
			name: "node mode: a range holding a node's address, the whole space, a duplicate node",
			self: "a",
			nodes: []Node{
				{Name: "a", Addrs: addrs("10.250.0.11"), PodCIDRs: prefixes("10.244.1.0/24")},
				{Name: "b", Addrs: addrs("10.250.0.12"), PodCIDRs: prefixes("10.250.0.0/16", "0.0.0.0/0", "10.244.2.7/24")},
				{Name: "b", Addrs: addrs("10.250.0.99"), PodCIDRs: prefixes("10.244.9.0/24")},
			},
			routes: []Route{unreachable("10.244.1.0/24", "a"), via("10.244.2.0/24", "10.250.0.12", "b")},
			problems: []problem{
				{"b", "", ErrDuplicateNode},
				{"b", "0.0.0.0/0", ErrInvalidPrefix},
				{"b", "10.250.0.0/16", ErrHoldsNodeAddress},
			},
		},
		{
			name:  "cluster mode: blocks of others via their owner, own blocks unreachable, free blocks nothing",
			self:  "a",
			nodes: threeNodes(),
			blocks: []Block{
				{Prefix: netip.MustParsePrefix("10.96.0.0/26"), Owner: "a"},
				{Prefix: netip.MustParsePrefix("10.96.0.64/26"), Owner: "b"},
				{Prefix: netip.MustParsePrefix("10.96.0.128/26"), Owner: "a"},
				{Prefix: netip.MustParsePrefix("10.96.0.192/26")},
				{Prefix: netip.MustParsePrefix("fd00:96::/122"), Owner: "c"},
				{Prefix: netip.MustParsePrefix("fd00:96::40/122"), Owner: "b"},
				{Prefix: netip.MustParsePrefix("10.96.1.0/26"), Owner: "gone"},
			},
			routes: []Route{
				unreachable("10.96.0.0/26", "a"),
				via("10.96.0.64/26", "10.250.0.12", "b"),
				unreachable("10.96.0.128/26", "a"),
				via("fd00:96::40/122", "fd00:250::12", "b"),
			},
			problems: []problem{
				{"c", "fd00:96::/122", ErrNoAddress},
				{"gone", "10.96.1.0/26", ErrUnknownOwner},
			},
		},
		{
			name:  "cluster mode: a borrowed address is routed to its borrower by every other node, the block's owner too",
			self:  "a",
			nodes: threeNodes(),
			blocks: []Block{
				{Prefix: netip.MustParsePrefix("10.96.0.0/26"), Owner: "a"},
				{Prefix: netip.MustParsePrefix("10.96.0.5/32"), Owner: "b", Borrowed: true},
				{Prefix: netip.MustParsePrefix("10.96.0.64/26"), Owner: "b"},
				{Prefix: netip.MustParsePrefix("10.96.0.70/32"), Owner: "c", Borrowed: true},
				{Prefix: netip.MustParsePrefix("10.96.0.71/32"), Owner: "a", Borrowed: true},
				{Prefix: netip.MustParsePrefix("fd00:96::40/122"), Owner: "b"},
				{Prefix: netip.MustParsePrefix("fd00:96::41/128"), Owner: "a", Borrowed: true},
			},
			routes: []Route{
				unreachable("10.96.0.0/26", "a"),
				via("10.96.0.5/32", "10.250.0.12", "b"),
				via("10.96.0.64/26", "10.250.0.12", "b"),
				via("10.96.0.70/32", "10.250.0.13", "c"),
				via("fd00:96::40/122", "fd00:250::12", "b"),
			},
		},
		{
			name:  "cluster mode: one address borrowed by two nodes is a problem, not two routes; a borrowed block is invalid",
			self:  "a",
			nodes: threeNodes(),
			blocks: []Block{
				{Prefix: netip.MustParsePrefix("10.96.0.0/26"), Owner: "a"},
				{Prefix: netip.MustParsePrefix("10.96.0.5/32"), Owner: "b", Borrowed: true},
				{Prefix: netip.MustParsePrefix("10.96.0.5/32"), Owner: "c", Borrowed: true},
				{Prefix: netip.MustParsePrefix("10.96.0.8/30"), Owner: "c", Borrowed: true},
			},
			routes: []Route{unreachable("10.96.0.0/26", "a")},
			problems: []problem{
				{"b", "10.96.0.5/32", ErrOverlap},
				{"c", "10.96.0.5/32", ErrOverlap},
				{"c", "10.96.0.8/30", ErrInvalidPrefix},
			},
		},
		{
			name:   "cluster mode with no blocks: no route, podCIDRs ignored",
			self:   "a",
			nodes:  threeNodes(),
			blocks: []Block{},
		},
		{
			name:  "cluster mode: self absent from the node list still owns its blocks",
			self:  "z",
			nodes: threeNodes()[1:2],
			blocks: []Block{
				{Prefix: netip.MustParsePrefix("10.96.0.0/26"), Owner: "z"},
				{Prefix: netip.MustParsePrefix("10.96.0.64/26"), Owner: "b"},
				{Prefix: netip.MustParsePrefix("10.96.0.64/27"), Owner: "z"},
			},
			routes: []Route{
				unreachable("10.96.0.0/26", "z"),
				unreachable("10.96.0.64/27", "z"),
			},
			problems: []problem{{"b", "10.96.0.64/26", ErrOverlap}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan := Desired(tt.self, tt.nodes, tt.blocks)
			if !slices.EqualFunc(plan.Routes, tt.routes, sameRoute) {
				t.Errorf("routes:\n got %v\nwant %v", plan.Routes, tt.routes)
			}
			if len(plan.Problems) != len(tt.problems) {
				t.Fatalf("problems: got %v, want %d: %v", plan.Problems, len(tt.problems), tt.problems)
			}
			for i, want := range tt.problems {
				got := plan.Problems[i]
				wantPrefix := netip.Prefix{}
				if want.prefix != "" {
					wantPrefix = netip.MustParsePrefix(want.prefix)
				}
				if got.Node != want.node || got.Prefix != wantPrefix || !errors.Is(got.Err, want.err) {
					t.Errorf("problem %d: got %v, want node %s %s %v", i, got, want.node, want.prefix, want.err)
				}
			}
			checkPlan(t, tt.self, tt.nodes, tt.blocks, plan)
		})
	}
}

func TestProblemString(t *testing.T) {
	plan := Desired("a", threeNodes(), nil)
	got := plan.Problems[0].String()
	if want := "node c: fd00:244:0:3::/64: node has no address of the family: IPv6"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := plan.Routes[1].String(); got != "10.244.2.0/24 via 10.250.0.12 (node b)" {
		t.Errorf("route string %q", got)
	}
	if got := unreachable("10.96.0.0/26", "a").String(); got != "unreachable 10.96.0.0/26 (node a)" {
		t.Errorf("route string %q", got)
	}
}

func TestClusterCIDRs(t *testing.T) {
	tests := []struct {
		name   string
		nodes  []Node
		blocks []Block
		want   []netip.Prefix
	}{
		{
			name:  "node mode: every node's podCIDRs, self included",
			nodes: threeNodes(),
			want:  prefixes("10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24", "fd00:244:0:1::/64", "fd00:244:0:2::/64", "fd00:244:0:3::/64"),
		},
		{
			name: "node mode: nested and duplicate ranges collapse, invalid ones are dropped",
			nodes: []Node{
				{Name: "a", PodCIDRs: prefixes("10.244.1.7/24", "10.244.0.0/16")},
				{Name: "b", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), {}, netip.MustParsePrefix("0.0.0.0/0")}},
			},
			want: prefixes("10.244.0.0/16"),
		},
		{
			name:  "cluster mode: blocks, owned or free; podCIDRs ignored",
			nodes: threeNodes(),
			blocks: []Block{
				{Prefix: netip.MustParsePrefix("10.96.0.64/26"), Owner: "b"},
				{Prefix: netip.MustParsePrefix("10.96.0.0/16")},
				{Prefix: netip.MustParsePrefix("10.97.0.0/26"), Owner: "a"},
			},
			want: prefixes("10.96.0.0/16", "10.97.0.0/26"),
		},
		{
			name:   "cluster mode without blocks: nothing",
			nodes:  threeNodes(),
			blocks: []Block{},
			want:   nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ClusterCIDRs(tt.nodes, tt.blocks)
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// checkPlan asserts what Desired promises whatever its input.
func checkPlan(t *testing.T, self string, nodes []Node, blocks []Block, plan Plan) {
	t.Helper()
	cluster := blocks != nil
	selfAddrs := map[netip.Addr]bool{}
	var allAddrs []netip.Addr
	seen := map[string]bool{}
	for _, n := range nodes {
		if seen[n.Name] {
			continue
		}
		seen[n.Name] = true
		for _, a := range n.Addrs {
			a = normAddr(a)
			if !a.IsValid() || a.IsUnspecified() {
				continue
			}
			allAddrs = append(allAddrs, a)
			if n.Name == self {
				selfAddrs[a] = true
			}
		}
	}
	var own, ownBorrowed []netip.Prefix
	borrowed := map[netip.Prefix]bool{} // addresses borrowed by a node other than self
	if cluster {
		for _, b := range blocks {
			p, ok := normPrefix(b.Prefix)
			switch {
			case !ok:
			case b.Borrowed && b.Owner == self:
				ownBorrowed = append(ownBorrowed, p)
			case b.Borrowed:
				borrowed[p] = true
			case b.Owner == self:
				own = append(own, p)
			}
		}
	} else {
		for _, n := range nodes {
			if n.Name != self {
				continue
			}
			for _, raw := range n.PodCIDRs {
				if p, ok := normPrefix(raw); ok {
					own = append(own, p)
				}
			}
			break
		}
	}
	for i, r := range plan.Routes {
		if !r.Dst.IsValid() || r.Dst != r.Dst.Masked() || r.Dst.Bits() == 0 {
			t.Errorf("route %v: destination not a masked, valid, proper prefix", r)
		}
		if i > 0 && comparePrefix(plan.Routes[i-1].Dst, r.Dst) >= 0 {
			t.Errorf("routes not sorted or not unique at %v", r)
		}
		for _, a := range allAddrs {
			if r.Dst.Contains(a) {
				t.Errorf("route %v holds node address %s", r, a)
			}
		}
		for _, o := range plan.Routes[:i] {
			if o.Node != r.Node && o.Dst.Overlaps(r.Dst) && borrowed[o.Dst] == borrowed[r.Dst] {
				t.Errorf("routes %v and %v overlap", o, r)
			}
		}
		switch r.Type {
		case Unicast:
			if r.Node == self {
				t.Errorf("route %v to self", r)
			}
			if selfAddrs[r.Via] || !r.Via.IsValid() || r.Via.Is4() != r.Dst.Addr().Is4() || r.Via.Zone() != "" {
				t.Errorf("route %v: next hop is self's, or of the wrong family", r)
			}
			for _, via := range append([]netip.Addr{r.Via}, r.Alt...) {
				if via.IsLoopback() || via.IsUnspecified() || via.IsMulticast() || via.IsLinkLocalUnicast() || selfAddrs[via] || via.Is4() != r.Dst.Addr().Is4() {
					t.Errorf("route %v: unusable next hop %s", r, via)
				}
			}
			for _, p := range own {
				if p.Overlaps(r.Dst) && !borrowed[r.Dst] {
					t.Errorf("route %v into self's pod range %s", r, p)
				}
			}
			for _, p := range ownBorrowed {
				if p.Overlaps(r.Dst) && borrowed[r.Dst] {
					t.Errorf("route %v to an address self borrowed (%s)", r, p)
				}
			}
		case Unreachable:
			if r.Node != self || !slices.Contains(own, r.Dst) {
				t.Errorf("unreachable route %v not for a pod range of self's", r)
			}
		default:
			t.Errorf("route %v of unknown type", r)
		}
	}
	for _, p := range plan.Problems {
		if p.Err == nil || strings.TrimSpace(p.String()) == "" {
			t.Errorf("problem without reason: %#v", p)
		}
	}
	for _, p := range ClusterCIDRs(nodes, blocks) {
		if !p.IsValid() || p.Bits() == 0 {
			t.Errorf("cluster CIDR %v", p)
		}
	}
}

// FuzzDesired builds a cluster from bytes: a few nodes with addresses and
// ranges drawn from small spaces so that overlaps, shared addresses and
// missing families happen often.
func FuzzDesired(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, false)
	f.Add([]byte{3, 0x41, 0x82, 0x13, 0x24, 0x55, 0x66, 0x07, 0x88, 0x19, 0xaa, 0xbb}, true)
	f.Add([]byte{0xff, 0xff, 0xff, 0, 0, 0, 0x80, 0x80}, true)
	f.Fuzz(func(t *testing.T, data []byte, cluster bool) {
		next := func() byte {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return b
		}
		names := []string{"a", "b", "c", "d", ""}
		addr := func(b byte) netip.Addr {
			switch b % 8 {
			case 0:
				return netip.AddrFrom4([4]byte{10, 250, 0, b % 4})
			case 1:
				return netip.AddrFrom16([16]byte{0xfd, 0, 2, 0x50, 15: b % 4})
			case 2:
				return netip.AddrFrom16([16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 250, 14: 0, 15: b % 4})
			case 3:
				return netip.MustParseAddr("fe80::1")
			case 4:
				return netip.AddrFrom4([4]byte{127, 0, 0, 1})
			case 5:
				return netip.Addr{}
			case 6:
				return netip.AddrFrom4([4]byte{10, 244, b % 4, 1})
			default:
				return netip.IPv6Unspecified()
			}
		}
		prefix := func(b, l byte) netip.Prefix {
			if b%2 == 0 {
				return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, b % 8, l}), int(l%33))
			}
			return netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 2, 0x44, 7: b % 8}), int(l%129))
		}
		var nodes []Node
		for range int(next() % 5) {
			n := Node{Name: names[next()%5]}
			for range int(next() % 4) {
				n.Addrs = append(n.Addrs, addr(next()))
			}
			for range int(next() % 4) {
				n.PodCIDRs = append(n.PodCIDRs, prefix(next(), next()))
			}
			nodes = append(nodes, n)
		}
		var blocks []Block
		if cluster {
			blocks = []Block{}
			for range int(next() % 8) {
				blocks = append(blocks, Block{Prefix: prefix(next(), next()), Owner: names[next()%5]})
			}
		}
		self := names[next()%4]
		plan := Desired(self, nodes, blocks)
		checkPlan(t, self, nodes, blocks, plan)
	})
}
