package ipam_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// TestParallelAdds110 runs kubelet's default max-pods worth of ADDs at once: 110
// distinct addresses, each the one the ledger holds; ADD repeated for the same
// attachment returns the same address; DEL with an empty CNI_NETNS releases.
func TestParallelAdds110(t *testing.T) {
	const pods = 110
	e := newEnv(t, agentenv.Options{})
	nsPath := netenv.Namespace(t, "ipl").Path
	l := e.list("1.0.0", "podnet", `[[{"subnet":"10.79.0.0/24"}]]`)
	c := ctx(t)

	got := make([][]string, pods)
	errs := make([]error, pods)
	var wg sync.WaitGroup
	for i := range pods {
		wg.Go(func() {
			res, err := e.cni.AddNetworkList(c, l, rt(fmt.Sprintf("pod%03d", i), nsPath))
			if err != nil {
				errs[i] = err
				return
			}
			got[i] = resultIPs(t, res)
		})
	}
	wg.Wait()
	seen := map[string]int{}
	for i := range pods {
		if errs[i] != nil {
			t.Fatalf("ADD pod%03d: %v", i, errs[i])
		}
		if len(got[i]) != 1 {
			t.Fatalf("ADD pod%03d gave %v", i, got[i])
		}
		if j, dup := seen[got[i][0]]; dup {
			t.Fatalf("pod%03d and pod%03d both got %s", i, j, got[i][0])
		}
		seen[got[i][0]] = i
	}
	leases := e.a.Leases(t)
	if len(leases) != pods {
		t.Fatalf("ledger holds %d leases, want %d", len(leases), pods)
	}
	for i := range pods {
		if held := ipsOf(leases, "podnet", fmt.Sprintf("pod%03d", i)); !slices.Equal(held, got[i]) {
			t.Fatalf("pod%03d: ledger holds %v, ADD answered %v", i, held, got[i])
		}
	}

	// ADD again, in parallel too: same addresses, nothing new allocated
	before := e.books()
	for i := range pods {
		wg.Go(func() {
			res, err := e.cni.AddNetworkList(c, l, rt(fmt.Sprintf("pod%03d", i), nsPath))
			if err != nil {
				errs[i] = err
				return
			}
			if again := resultIPs(t, res); !slices.Equal(again, got[i]) {
				errs[i] = fmt.Errorf("repeated ADD gave %v, first %v", again, got[i])
			}
		})
	}
	wg.Wait()
	for i := range pods {
		if errs[i] != nil {
			t.Fatalf("pod%03d: %v", i, errs[i])
		}
	}
	e.sameBooks(before)

	// DEL with an empty CNI_NETNS (as RemovePodSandbox sends it) releases
	for i := range pods {
		wg.Go(func() {
			errs[i] = e.cni.DelNetworkList(c, l, rt(fmt.Sprintf("pod%03d", i), ""))
		})
	}
	wg.Wait()
	for i := range pods {
		if errs[i] != nil {
			t.Fatalf("DEL pod%03d with empty CNI_NETNS: %v", i, errs[i])
		}
	}
	if leases := e.a.Leases(t); len(leases) != 0 {
		t.Fatalf("after DEL the ledger still holds %d leases: %v", len(leases), leases)
	}
	a := e.a.Audit(t)
	if len(a.Pools) != 1 || a.Pools[0].Allocations != pods || a.Pools[0].Releases != pods {
		t.Fatalf("audit pools %+v, want %d allocations and releases", a.Pools, pods)
	}
}
