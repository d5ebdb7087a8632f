package ipam_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// TestExcludeKeepsAddressesOut: ipam.exclude keeps its addresses from every pod
// (node mode's reservations): the plugin, run as a runtime runs it, fills a /27 with
// two entries excluded; no lease gets one, the pool is full with exactly the others,
// each lease says it came from the default pool, and the books balance.
func TestExcludeKeepsAddressesOut(t *testing.T) {
	e := newEnv(t, agentenv.Options{})
	nsPath := netenv.Namespace(t, "ipl").Path
	conf := strings.Replace(e.pluginConf("1.0.0", "exnet", `[[{"subnet":"10.83.0.0/27"}]]`), `"ranges":`, `"exclude":["10.83.0.2","10.83.0.8/30"],"ranges":`, 1)
	ex := []netip.Prefix{netip.MustParsePrefix("10.83.0.2/32"), netip.MustParsePrefix("10.83.0.8/30")}
	n := 0
	for i := range 40 {
		_, cerr := execPlugin(t, call{Cmd: "ADD", ContainerID: fmt.Sprint("ex", i), Netns: nsPath, Stdin: conf})
		if cerr != nil {
			if !strings.Contains(cerr.Msg, "in use") {
				t.Fatalf("ADD %d: %+v", i, cerr)
			}
			break
		}
		n++
	}
	// a /27 holds 30 addresses less the gateway (.1): 29, less 5 excluded
	if n != 24 {
		t.Errorf("%d ADDs succeeded before the pool was full, want 24", n)
	}
	for _, ls := range e.a.Leases(t) {
		a := netip.MustParsePrefix(ls.IPs[0]).Addr()
		for _, p := range ex {
			if p.Contains(a) {
				t.Errorf("lease %s got excluded address %s", ls.ContainerID, a)
			}
		}
		if ls.Why != "default pool" {
			t.Errorf("lease %s: why %q, want \"default pool\"", ls.ContainerID, ls.Why)
		}
	}
}
