package kubeds_test

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ipledger/ipledger/internal/datastore/kubeds"
)

// TestManifestHoldsClusterModeAndKeepsTheNodeDaemonSet: deploy/ipledger.yaml
// parses into the objects one kubectl apply installs: the CRDs and RBAC of
// cluster mode next to the node-mode DaemonSet, which still runs without API
// credentials (no token mounted), on the host network, with its install-cni
// init container and the agent's command as before, and with NODE_NAME and
// POD_NAMESPACE from the downward API (cluster mode's defaults for
// --node-name and --kube-namespace). deploy/cluster/ipledger.yaml, the base
// of the cluster-mode overlay, is the same file.
func TestManifestHoldsClusterModeAndKeepsTheNodeDaemonSet(t *testing.T) {
	docs, err := kubeds.Documents(manifest(t))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	byKind := map[string]*unstructured.Unstructured{}
	for _, d := range docs {
		got = append(got, d.GetKind()+"/"+d.GetName())
		byKind[d.GetKind()+"/"+d.GetName()] = d
	}
	want := []string{
		"Namespace/ipledger",
		"CustomResourceDefinition/ipblocks.ipledger.io", "CustomResourceDefinition/ippools.ipledger.io", "CustomResourceDefinition/iprecords.ipledger.io",
		"ServiceAccount/ipledgerd", "ClusterRole/ipledgerd", "ClusterRoleBinding/ipledgerd",
		"Role/ipledgerd-leases", "RoleBinding/ipledgerd-leases",
		"ConfigMap/ipledger-cni", "DaemonSet/ipledgerd",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("manifest objects:\n%q\nwant\n%q", got, want)
	}
	for _, c := range []struct {
		crd, plural, kind string
	}{{"ipblocks.ipledger.io", "ipblocks", "IPBlock"}, {"ippools.ipledger.io", "ippools", "IPPool"}, {"iprecords.ipledger.io", "iprecords", "IPRecord"}} {
		o := byKind["CustomResourceDefinition/"+c.crd].Object
		if g, _, _ := unstructured.NestedString(o, "spec", "group"); g != kubeds.Group {
			t.Errorf("%s: group %q", c.crd, g)
		}
		if sc, _, _ := unstructured.NestedString(o, "spec", "scope"); sc != "Cluster" {
			t.Errorf("%s: scope %q, want Cluster", c.crd, sc)
		}
		if k, _, _ := unstructured.NestedString(o, "spec", "names", "kind"); k != c.kind {
			t.Errorf("%s: kind %q, want %s", c.crd, k, c.kind)
		}
		vs, _, _ := unstructured.NestedSlice(o, "spec", "versions")
		if len(vs) != 1 || vs[0].(map[string]any)["name"] != kubeds.Version {
			t.Errorf("%s: versions %v, want one, %s", c.crd, vs, kubeds.Version)
		}
	}
	ds := byKind["DaemonSet/ipledgerd"].Object
	pod, _, _ := unstructured.NestedMap(ds, "spec", "template", "spec")
	for field, want := range map[string]any{
		"serviceAccountName":           "ipledgerd",
		"automountServiceAccountToken": false,
		"hostNetwork":                  true,
		"priorityClassName":            "system-node-critical",
	} {
		if pod[field] != want {
			t.Errorf("DaemonSet pod %s = %v, want %v", field, pod[field], want)
		}
	}
	inits, _, _ := unstructured.NestedSlice(pod, "initContainers")
	ctrs, _, _ := unstructured.NestedSlice(pod, "containers")
	if len(inits) != 1 || len(ctrs) != 1 {
		t.Fatalf("DaemonSet: %d init containers, %d containers; want 1 and 1", len(inits), len(ctrs))
	}
	cmd := ctrs[0].(map[string]any)["command"]
	wantCmd := []any{"/usr/local/bin/ipledgerd", "--state-dir", "/var/lib/ipledger", "--socket", "/run/ipledger/ipledger.sock",
		"--cri-endpoint", "unix:///run/containerd/containerd.sock", "--reconcile-interval", "30s", "--release-grace", "60s",
		"--metrics-addr", "127.0.0.1:9780"}
	if !reflect.DeepEqual(cmd, wantCmd) {
		t.Errorf("agent command %v, want %v", cmd, wantCmd)
	}
	env, _, _ := unstructured.NestedSlice(ctrs[0].(map[string]any), "env")
	wantEnv := []any{
		map[string]any{"name": "NODE_NAME", "valueFrom": map[string]any{"fieldRef": map[string]any{"fieldPath": "spec.nodeName"}}},
		map[string]any{"name": "POD_NAMESPACE", "valueFrom": map[string]any{"fieldRef": map[string]any{"fieldPath": "metadata.namespace"}}},
	}
	if !reflect.DeepEqual(env, wantEnv) {
		t.Errorf("agent env %v, want %v", env, wantEnv)
	}
	if c := inits[0].(map[string]any)["command"].([]any); len(c) < 2 || c[1] != "install-cni" {
		t.Errorf("init container command %v, want ipledgerd install-cni", c)
	}
}

// TestClusterOverlayBaseIsTheManifest: the cluster-mode overlay
// (kubectl apply -k deploy/cluster) builds on a copy of deploy/ipledger.yaml
// (kustomize loads nothing from outside its directory); the copy must not
// drift from the manifest.
func TestClusterOverlayBaseIsTheManifest(t *testing.T) {
	cp, err := os.ReadFile(filepath.Join(filepath.Dir(manifestPath), "cluster", "ipledger.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(cp, manifest(t)) {
		t.Fatalf("deploy/cluster/ipledger.yaml differs from %s: run `make manifests`", manifestPath)
	}
}
