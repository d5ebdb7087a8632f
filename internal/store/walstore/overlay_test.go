package walstore

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/store"
)

// The overlay's index of history keys by address finds exactly what a scan of every
// key with the address's prefix finds, through writes, deletes and prunes, for
// networks whose names are prefixes of one another.
func TestOverlayHistoryIndex(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	nets := []string{"n", "n1", "n-1", "net"}
	ips := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::1")}
	o := newOverlay()
	idx := uint64(0)
	for step := range 3000 {
		idx++
		var ops []op
		for range 1 + rng.IntN(4) {
			k := string(store.HistoryKey(nets[rng.IntN(len(nets))], ips[rng.IntN(len(ips))], uint64(rng.IntN(20))))
			ops = append(ops, op{bucket: bHistory, key: k, del: rng.IntN(3) == 0, val: []byte("x")})
		}
		o.apply(ops, idx)
		if rng.IntN(50) == 0 {
			o.prune(idx - uint64(rng.IntN(30)))
		}
		view := o.clone()
		for _, n := range nets {
			for _, ip := range ips {
				prefix := store.AddrKey(n, ip)
				var got, want []string
				view.withPrefix(bHistory, prefix, func(k string, e entry) { got = append(got, fmt.Sprint(k, e.del, e.idx)) })
				for k, e := range view.m[bHistory] {
					if strings.HasPrefix(k, string(prefix)) {
						want = append(want, fmt.Sprint(k, e.del, e.idx))
					}
				}
				slices.Sort(got)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Fatalf("step %d, %s %s: index gives %q, a scan %q", step, n, ip, got, want)
				}
			}
		}
	}
}
