//go:build kubelet

package kube_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/test/kube/matrix"
)

// MatrixOutEnv names a file the scenarios append their cell of the runtime
// matrix to (one JSON object a line; make runtime-matrix sets it and
// test/kube/matrixdoc renders the lines into docs/runtimes.md). When it is
// set, the scenarios that run on the manifest's own network (churn, seed 004)
// run with the host-local control chained in as the others do.
const MatrixOutEnv = "IPLEDGER_MATRIX_OUT"

// record logs c and, under MatrixOutEnv, appends it to that file.
func (n *node) record(t testing.TB, c matrix.Cell) {
	t.Helper()
	c.Runtime, c.Date = n.runtimeVersion(t), time.Now().UTC()
	t.Logf("matrix cell: %+v", c)
	if p := os.Getenv(MatrixOutEnv); p != "" {
		if err := matrix.Append(p, c); err != nil {
			t.Fatal(err)
		}
	}
}

// runtimeVersion is the runtime's own answer to the CRI Version call
// (containerd's version string, e.g. 1.6.20~ds1 or v2.2.1).
func (n *node) runtimeVersion(t testing.TB) string {
	t.Helper()
	v, err := n.c.Containerd.Client(t).Version(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return v.Name + " " + v.Version
}

// matrixRun reports whether this run writes the runtime matrix.
func matrixRun() bool { return os.Getenv(MatrixOutEnv) != "" }

// control is the host-local network the test plugin (failplugin, its state
// in state) delegates to beside ipledger: the control's books in dir, its
// addresses in subnet (never configured anywhere: host-local only writes
// files).
type control struct {
	name, subnet, dir, state string
}

func newControl(t testing.TB, name, subnet string) control {
	return control{name: name, subnet: subnet, dir: t.TempDir(), state: t.TempDir()}
}

// sandboxes is how many distinct sandboxes the test plugin saw an ADD for.
func (c control) sandboxes(t testing.TB) int {
	ids := map[string]bool{}
	for _, id := range attempts(t, c.state)["ADD"] {
		ids[id] = true
	}
	return len(ids)
}

// json is the control's network configuration for failplugin's "control".
func (c control) json() string {
	return fmt.Sprintf(`{"cniVersion": "1.0.0", "name": %q, "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}}`, c.name, c.subnet, c.dir)
}

// held is how many addresses host-local holds in the control's books.
func (c control) held(t testing.TB) int {
	t.Helper()
	es, err := os.ReadDir(filepath.Join(c.dir, c.name))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	k := 0
	for _, e := range es {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			k++
		}
	}
	return k
}

// chain is a conflist of ipledger-veth + ipledger (network name, pool
// subnet) followed by the test plugin with the control and extra (more of
// failplugin's settings, as JSON members, may be empty).
func (n *node) chain(name, subnet string, c control, extra string) string {
	if extra != "" {
		extra = ", " + extra
	}
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": %q,
  "plugins": [
    {"type": "ipledger-veth", "mtu": 1500,
     "ipam": {"type": "ipledger", "socket": %q, "spoolDir": %q,
              "ranges": [[{"subnet": %q}]]}},
    {"type": "ipledger-testfail", "stateDir": %q, "control": %s%s}
  ]
}`, name, n.sock, filepath.Join(n.stateDir, "spool"), subnet, c.state, c.json(), extra)
}

// withControl puts the host-local control beside the manifest's network
// (same name, the node's podCIDR) for a matrix run; otherwise the network
// stays the manifest's own and the control is absent (ok false).
func (n *node) withControl(t testing.TB, subnet string) (control, bool) {
	t.Helper()
	c := newControl(t, network+"-control", subnet)
	if !matrixRun() {
		return c, false
	}
	n.failPlugin(t)
	n.withConflist(t, n.chain(network, "usePodCidr", c, ""))
	return c, true
}

// history is every release of the addresses .2 to .last of the /24 prefix
// (e.g. "10.236.1.") in network, from the ledger's history.
func (n *node) history(t testing.TB, network, prefix string, last int) []ledger.Release {
	t.Helper()
	var all []ledger.Release
	for host := 2; host <= last; host++ {
		out, _, err := n.ctl("history", "--network", network, "--ip", fmt.Sprintf("%s%d", prefix, host), "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var hist []ledger.Release
		if err := json.Unmarshal([]byte(out), &hist); err != nil {
			t.Fatalf("history -o json: %v: %q", err, out)
		}
		all = append(all, hist...)
	}
	return all
}

// readyReleased counts the releases in rels of a sandbox the runtime reports
// READY now: false releases (invariant 2).
func (n *node) readyReleased(t testing.TB, rels []ledger.Release) int {
	t.Helper()
	sbs, err := n.c.Containerd.Client(t).ListSandboxes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ready := map[string]bool{}
	for _, s := range sbs {
		if s.Ready() {
			ready[s.ID] = true
		}
	}
	k := 0
	for _, r := range rels {
		if ready[r.Key.ContainerID] {
			t.Errorf("false release: %s of %s (%s/%s) released (%s) while its sandbox is READY", r.IP, r.Key.ContainerID, r.Pod.Namespace, r.Pod.Name, r.Reason)
			k++
		}
	}
	return k
}

// attempts parses failplugin's attempts.log in dir: per verb ("ADD",
// "DEL"), the container IDs called, in order.
func attempts(t testing.TB, dir string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "attempts.log"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 4 {
			out[f[1]] = append(out[f[1]], f[3])
		}
	}
	return out
}
