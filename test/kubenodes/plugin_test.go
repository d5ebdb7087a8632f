//go:build kubelet

package kubenodes_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/fleet"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
)

// kubectlPlugin runs `kubectl ipledger args...` as an operator would: kubectl finds
// the built kubectl-ipledger on PATH, and the admin's kubeconfig comes from
// KUBECONFIG. It returns stdout, stderr and the exit status.
func (cl *cluster) kubectlPlugin(args ...string) (string, string, int) {
	t := cl.T
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(cl.C.Bin, "kubectl"), append([]string{"ipledger"}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+agentenv.Bin(t)+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+cl.C.Kubeconfig)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), stderr.String(), 0
	case errors.As(err, &exit):
		return stdout.String(), stderr.String(), exit.ExitCode()
	}
	t.Fatalf("kubectl ipledger %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	return "", "", 0
}

// checkPlugin (issue 27): kubectl ipledger over the three nodes, through the API
// server's pods/exec:
//   - audit prints a row per node, every one BALANCED, and exits 0;
//   - leases -o json lists each server pod's address under its node, with the
//     agent pod that answered;
//   - in cluster mode, blocks shows each node's own blocks under it;
//   - a user allowed to list the agent pods but not to exec into them gets each
//     node named with the RBAC it lacks (create pods/exec in namespace ipledger)
//     and exit 3; a user who may not even list them, exit 2.
func (cl *cluster) checkPlugin() {
	t := cl.T
	t.Helper()
	out, errOut, code := cl.kubectlPlugin("audit")
	t.Logf("kubectl ipledger audit (exit %d):\n%s%s", code, out, errOut)
	if code != fleet.ExitOK {
		t.Errorf("kubectl ipledger audit: exit %d, want 0", code)
	}
	rows := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			rows[f[0]] = f
		}
	}
	for _, nd := range cl.Nodes {
		if r := rows[nd.Name]; len(r) < 2 || r[1] != "BALANCED" {
			t.Errorf("kubectl ipledger audit: node %s's row %q, want BALANCED", nd.Name, r)
		}
	}

	out, errOut, code = cl.kubectlPlugin("leases")
	t.Logf("kubectl ipledger leases (exit %d):\n%s%s", code, out, errOut)
	out, errOut, code = cl.kubectlPlugin("leases", "-o", "json")
	var leases []struct {
		Node   string          `json:"node"`
		Pod    string          `json:"pod"`
		Status string          `json:"status"`
		Result []api.LeaseView `json:"result"`
	}
	if err := json.Unmarshal([]byte(out), &leases); code != 0 || err != nil {
		t.Errorf("kubectl ipledger leases -o json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	srv, err := cl.C.Pods("default", "app=srv")
	if err != nil {
		t.Fatal(err)
	}
	for _, nd := range cl.Nodes {
		var ip string
		for _, p := range srv {
			if p.Metadata.Name == "srv-"+nd.Name {
				ip = p.Status.PodIP
			}
		}
		found := false
		for _, e := range leases {
			if e.Node != nd.Name {
				continue
			}
			if e.Status != fleet.StatusOK || !strings.HasPrefix(e.Pod, "ipledgerd-") {
				t.Errorf("kubectl ipledger leases -o json: node %s: status %q pod %q", nd.Name, e.Status, e.Pod)
			}
			for _, l := range e.Result {
				for _, a := range l.IPs {
					if l.Name == "srv-"+nd.Name && strings.HasPrefix(a, ip+"/") {
						found = true
					}
				}
			}
		}
		if ip == "" || !found {
			t.Errorf("kubectl ipledger leases -o json: no lease of srv-%s (%s) under node %s:\n%s", nd.Name, ip, nd.Name, out)
		}
	}

	if cl.ClusterMode {
		out, errOut, code = cl.kubectlPlugin("blocks")
		t.Logf("kubectl ipledger blocks (exit %d):\n%s%s", code, out, errOut)
		for _, nd := range cl.Nodes {
			if !strings.Contains(out, "\n"+nd.Name+" ") || !strings.Contains(out, " "+nd.Name+" ") {
				t.Errorf("kubectl ipledger blocks: no block of %s under it", nd.Name)
			}
		}
		if code != 0 {
			t.Errorf("kubectl ipledger blocks: exit %d", code)
		}
	}

	// RBAC decides: viewer may list the agent pods but not exec into them.
	cl.C.Apply(t, `apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: ipledger-viewer, namespace: ipledger}
rules:
  - {apiGroups: [""], resources: [pods], verbs: [get, list]}
  - {apiGroups: [apps], resources: [daemonsets], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: ipledger-viewer, namespace: ipledger}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: ipledger-viewer}
subjects:
  - {apiGroup: rbac.authorization.k8s.io, kind: User, name: viewer}
`)
	out, errOut, code = cl.kubectlPlugin("audit", "--as", "viewer")
	t.Logf("kubectl ipledger audit --as viewer (exit %d):\n%s%s", code, out, errOut)
	if code != fleet.ExitUnreachable {
		t.Errorf("kubectl ipledger audit --as viewer: exit %d, want %d", code, fleet.ExitUnreachable)
	}
	for _, nd := range cl.Nodes {
		if !strings.Contains(errOut, "node "+nd.Name+": exec in pod ipledger/ipledgerd-") || !strings.Contains(errOut, "needs create on pods/exec in namespace ipledger") {
			t.Errorf("kubectl ipledger audit --as viewer: node %s and the missing pods/exec not named", nd.Name)
		}
	}
	out, errOut, code = cl.kubectlPlugin("audit", "--as", "nobody")
	t.Logf("kubectl ipledger audit --as nobody (exit %d):\n%s%s", code, out, errOut)
	if code != fleet.ExitPlugin || !strings.Contains(errOut, "needs list on pods in namespace ipledger") {
		t.Errorf("kubectl ipledger audit --as nobody: exit %d, want %d and the missing list on pods named", code, fleet.ExitPlugin)
	}
}
