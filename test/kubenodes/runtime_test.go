package kubenodes_test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"time"

	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/testenv/containerdenv"
)

// checkRuntime: every node runs the containerd containerdenv selects (its CRI
// Version says so), the DaemonSet's install-cni wrote the conflist at the
// cniVersion that runtime loads (1.1.0 on containerd 2.x: the runtime calls
// STATUS and the Node follows the agent's readiness), and the apiserver admits
// a privileged pod, as a kubeadm cluster's does (--allow-privileged=true: the
// network tests that need one run here).
func (cl *cluster) checkRuntime() {
	t := cl.t
	t.Helper()
	want, err := containerdenv.Selected()
	if err != nil {
		t.Fatal(err)
	}
	wantVersion, wantCNI := "v"+want, "1.0.0"
	if want == containerdenv.Debian {
		wantVersion = "1.6."
	}
	if containerdenv.Major(want) >= 2 {
		wantCNI = "1.1.0"
	}
	for _, nd := range cl.nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c, err := cri.Dial(ctx, nd.Endpoint(), 30*time.Second)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", nd.Name, err)
		}
		v, err := c.Version(context.Background())
		c.Close()
		if err != nil {
			t.Fatalf("%s: %v", nd.Name, err)
		}
		if v.Name != "containerd" || !strings.HasPrefix(v.Version, wantVersion) {
			t.Errorf("%s runs %s %s, want containerd %s (%s)", nd.Name, v.Name, v.Version, want, containerdenv.VersionEnv)
		}
		b, err := os.ReadFile(nd.HostPath("/etc/cni/net.d/10-ipledger.conflist"))
		if err != nil {
			t.Fatalf("%s: the installed conflist: %v", nd.Name, err)
		}
		var conf struct {
			CNIVersion string `json:"cniVersion"`
		}
		if err := json.Unmarshal(b, &conf); err != nil {
			t.Fatalf("%s: the installed conflist: %v", nd.Name, err)
		}
		if conf.CNIVersion != wantCNI {
			t.Errorf("%s: install-cni wrote cniVersion %q on %s %s, want %s", nd.Name, conf.CNIVersion, v.Name, v.Version, wantCNI)
		}
		t.Logf("%s: %s %s, conflist cniVersion %s", nd.Name, v.Name, v.Version, conf.CNIVersion)
	}
	priv := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"privileged","namespace":"default"},
"spec":{"containers":[{"name":"c","image":"` + podImage + `","securityContext":{"privileged":true}}]}}`
	if out, err := cl.c.KubectlIn([]byte(priv), "create", "--dry-run=server", "-f", "-"); err != nil {
		t.Errorf("a privileged pod is refused: %v\n%s", err, out)
	}
}
