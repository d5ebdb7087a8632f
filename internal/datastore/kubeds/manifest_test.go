package kubeds_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore/kubeds"
	"github.com/ipledger/ipledger/internal/ipam"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// TestManifestHoldsClusterModeAndKeepsTheNodeDaemonSet: deploy/ipledger.yaml
// parses into the objects one kubectl apply installs: the CRDs and RBAC of
// cluster mode next to the node-mode DaemonSet, which runs with the
// ServiceAccount's token (it reads the Nodes in node mode too), on the host
// network, with its install-cni init container and the agent's command given
// --node-name $(NODE_NAME), NODE_NAME and POD_NAMESPACE from the downward API,
// NET_ADMIN for routes and masquerade, RBAC for the Nodes, their status and
// Events on them, and
// a conflist whose range is usePodCidr (one manifest for every node).
// deploy/cluster/ipledger.yaml, the base of the cluster-mode overlay, is the
// same file.
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
		"CustomResourceDefinition/ipblocks.ipledger.io", "CustomResourceDefinition/ippools.ipledger.io",
		"CustomResourceDefinition/ipreservations.ipledger.io", "CustomResourceDefinition/iprecords.ipledger.io",
		"ServiceAccount/ipledgerd", "ClusterRole/ipledgerd", "ClusterRoleBinding/ipledgerd",
		"ValidatingAdmissionPolicy/ipledgerd-own-node-status", "ValidatingAdmissionPolicyBinding/ipledgerd-own-node-status",
		"ConfigMap/ipledger-cni", "DaemonSet/ipledgerd",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("manifest objects:\n%q\nwant\n%q", got, want)
	}
	for _, c := range []struct {
		crd, plural, kind string
	}{{"ipblocks.ipledger.io", "ipblocks", "IPBlock"}, {"ippools.ipledger.io", "ippools", "IPPool"},
		{"ipreservations.ipledger.io", "ipreservations", "IPReservation"}, {"iprecords.ipledger.io", "iprecords", "IPRecord"}} {
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
		"automountServiceAccountToken": true,
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
		"--metrics-addr", "127.0.0.1:9780", "--node-name", "$(NODE_NAME)"}
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
	caps, _, _ := unstructured.NestedStringSlice(ctrs[0].(map[string]any), "securityContext", "capabilities", "add")
	if !reflect.DeepEqual(caps, []string{"SYS_ADMIN", "NET_ADMIN"}) {
		t.Errorf("agent capabilities %v, want SYS_ADMIN (netns checks) and NET_ADMIN (routes, masquerade)", caps)
	}
	rules, _, _ := unstructured.NestedSlice(byKind["ClusterRole/ipledgerd"].Object, "rules")
	var nodeRules []string
	for _, r := range rules {
		rm := r.(map[string]any)
		for _, res := range rm["resources"].([]any) {
			if res == "nodes" || res == "nodes/status" || res == "namespaces" || res == "events" {
				nodeRules = append(nodeRules, fmt.Sprint(rm["apiGroups"], res, rm["verbs"]))
			}
		}
	}
	// Events on the Node: client-go's events.k8s.io recorder creates, and patches
	// an Event that recurs; a namespace's ipledger.io/pool is read by one GET
	if want := []string{"[]nodes[get list watch]", "[]nodes/status[patch]", "[]namespaces[get list watch]", "[events.k8s.io]events[create patch]"}; !reflect.DeepEqual(nodeRules, want) {
		t.Errorf("ClusterRole rules on Nodes, Namespaces and Events %v, want %v", nodeRules, want)
	}
	// node mode writes no cluster-mode record: those rights are deploy/cluster's
	for _, r := range rules {
		for _, g := range r.(map[string]any)["apiGroups"].([]any) {
			if g == kubeds.Group || g == "coordination.k8s.io" {
				t.Errorf("node mode's ClusterRole has a rule on %v: cluster mode's (deploy/cluster/rbac.yaml)", r)
			}
		}
	}
	conflist, _, _ := unstructured.NestedString(byKind["ConfigMap/ipledger-cni"].Object, "data", "ipledger.conflist")
	if !strings.Contains(conflist, `"ranges": [[{"subnet": "usePodCidr"}]]`) {
		t.Errorf("the conflist's ranges are not usePodCidr:\n%s", conflist)
	}
}

// TestClusterOverlayRBAC: deploy/cluster adds cluster mode's rights (the records'
// ClusterRole and the node Leases' Role, bound to the agents' ServiceAccount) to the
// node-mode manifest, and the overlay lists the file.
func TestClusterOverlayRBAC(t *testing.T) {
	dir := filepath.Join(filepath.Dir(manifestPath), "cluster")
	b, err := os.ReadFile(filepath.Join(dir, "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := kubeds.Documents(b)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	rules := map[string][]any{}
	for _, d := range docs {
		got = append(got, d.GetKind()+"/"+d.GetName())
		rules[d.GetKind()], _, _ = unstructured.NestedSlice(d.Object, "rules")
	}
	want := []string{"ClusterRole/ipledgerd-cluster", "ClusterRoleBinding/ipledgerd-cluster", "Role/ipledgerd-leases", "RoleBinding/ipledgerd-leases"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("deploy/cluster/rbac.yaml objects %q, want %q", got, want)
	}
	if r := fmt.Sprint(rules["ClusterRole"]); !strings.Contains(r, "[ipledger.io]") || !strings.Contains(r, "ipblocks ippools iprecords") {
		t.Errorf("cluster ClusterRole rules %s", r)
	}
	// the IPReservations are the operator's: the agents read them (a list and
	// a watch), never write them
	if r := fmt.Sprint(rules["ClusterRole"]); !strings.Contains(r, "resources:[ipreservations] verbs:[list watch]") {
		t.Errorf("cluster ClusterRole rules %s: want ipreservations [list watch] and nothing more", r)
	}
	if r := fmt.Sprint(rules["Role"]); !strings.Contains(r, "[coordination.k8s.io]") || !strings.Contains(r, "[leases]") {
		t.Errorf("leases Role rules %s", r)
	}
	k, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(k), "\n  - rbac.yaml") {
		t.Error("deploy/cluster/kustomization.yaml does not list rbac.yaml")
	}
}

// TestClusterOverlayBaseIsTheManifest: the cluster-mode and dual-stack
// overlays (kubectl apply -k deploy/cluster, deploy/dualstack) build on a
// copy of deploy/ipledger.yaml (kustomize loads nothing from outside its
// directory); the copies must not drift from the manifest.
func TestClusterOverlayBaseIsTheManifest(t *testing.T) {
	for _, overlay := range []string{"cluster", "dualstack"} {
		cp, err := os.ReadFile(filepath.Join(filepath.Dir(manifestPath), overlay, "ipledger.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(cp, manifest(t)) {
			t.Errorf("deploy/%s/ipledger.yaml differs from %s: run `make manifests`", overlay, manifestPath)
		}
	}
}

// TestDualStackOverlay: kubectl kustomize deploy/dualstack (kubectl's own
// kustomize, as kubectl apply -k runs it) gives deploy/ipledger.yaml's objects
// with one change: the conflist's ranges are usePodCidr and usePodCidrIPv6.
// That conflist passes the plugin's own config parsing, and a Node with a
// podCIDR of each family resolves it to one range set per family; a Node with
// an IPv4 podCIDR only is refused naming the missing family (ADD answers "try
// again later" until the controller manager gives the IPv6 one).
func TestDualStackOverlay(t *testing.T) {
	docs := kustomize(t, "dualstack")
	base, err := kubeds.Documents(manifest(t))
	if err != nil {
		t.Fatal(err)
	}
	baseByName := map[string]*unstructured.Unstructured{}
	for _, d := range base {
		baseByName[d.GetKind()+"/"+d.GetName()] = d
	}
	if len(docs) != len(base) {
		t.Fatalf("deploy/dualstack has %d objects, deploy/ipledger.yaml %d", len(docs), len(base))
	}
	var conflist string
	for _, d := range docs {
		key := d.GetKind() + "/" + d.GetName()
		b := baseByName[key]
		if b == nil {
			t.Fatalf("deploy/dualstack has %s, which deploy/ipledger.yaml does not", key)
		}
		if key == "ConfigMap/ipledger-cni" {
			conflist, _, _ = unstructured.NestedString(d.Object, "data", "ipledger.conflist")
			continue
		}
		// kustomize's YAML reader folds the more-indented lines of a ">-"
		// scalar (the admission policy's CEL) unlike sigs.k8s.io/yaml: equal
		// up to runs of white space
		if !reflect.DeepEqual(foldSpace(d.Object), foldSpace(b.Object)) {
			t.Errorf("deploy/dualstack changes %s; only the conflist may differ:\n%v\nwant\n%v", key, d.Object, b.Object)
		}
	}
	baseConflist, _, _ := unstructured.NestedString(baseByName["ConfigMap/ipledger-cni"].Object, "data", "ipledger.conflist")
	dual, single := decodeConflist(t, conflist), decodeConflist(t, baseConflist)
	for _, c := range []map[string]any{dual, single} {
		ipamOf := c["plugins"].([]any)[0].(map[string]any)["ipam"].(map[string]any)
		delete(ipamOf, "ranges")
		delete(ipamOf, "blockSize") // cluster mode's; node mode ignores it
	}
	if !reflect.DeepEqual(dual, single) {
		t.Errorf("the dual-stack conflist differs from deploy/ipledger.yaml's in more than its ranges:\n%v\nwant\n%v", dual, single)
	}

	conf, err := ipam.FromConflist([]byte(conflist)) // as the runtime hands it to the plugin
	if err != nil {
		t.Fatalf("the dual-stack conflist's ipam: %v", err)
	}
	sets := conf.IPAM.RangeSets()
	v4, v6 := netip.MustParsePrefix("10.236.1.0/24"), netip.MustParsePrefix("fd00:236:0:1::/64")
	got, err := pool.Resolve(sets, []netip.Prefix{v4, v6})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0][0].Subnet != v4 || got[1][0].Subnet != v6 {
		t.Fatalf("a Node with podCIDRs %s,%s: ranges %v, want one set of each", v4, v6, got)
	}
	if _, err := pool.Resolve(sets, []netip.Prefix{v4}); !errors.Is(err, pool.ErrNoPodCIDR) || !strings.Contains(err.Error(), "usePodCidrIPv6") {
		t.Fatalf("a Node with an IPv4 podCIDR only: %v, want %v naming usePodCidrIPv6", err, pool.ErrNoPodCIDR)
	}
}

// TestClusterOverlayPreparesTheNetwork: kubectl kustomize deploy/cluster gives
// the agent --conflist on the file install-cni installs, mounted from the same
// ConfigMap, and that conflist passes the checks ipledgerd makes of it at start
// in cluster mode (an ipledger ipam, ranges given as CIDRs, a block size that
// fits them), so every agent sets its network up before its first ADD.
func TestClusterOverlayPreparesTheNetwork(t *testing.T) {
	docs := kustomize(t, "cluster")
	var conflist string
	var agent map[string]any
	var inits []any
	for _, d := range docs {
		switch d.GetKind() + "/" + d.GetName() {
		case "ConfigMap/ipledger-cni":
			conflist, _, _ = unstructured.NestedString(d.Object, "data", "ipledger.conflist")
		case "DaemonSet/ipledgerd":
			ctrs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
			agent = ctrs[0].(map[string]any)
			inits, _, _ = unstructured.NestedSlice(d.Object, "spec", "template", "spec", "initContainers")
		}
	}
	if agent == nil || len(inits) != 1 {
		t.Fatal("deploy/cluster has no ipledgerd DaemonSet with its install-cni init container")
	}
	cmd := fmt.Sprint(agent["command"])
	for _, want := range []string{"--datastore=kubernetes", "--conflist=/etc/ipledger/ipledger.conflist"} {
		if !strings.Contains(cmd, want) {
			t.Errorf("agent command %s lacks %s", cmd, want)
		}
	}
	// the agent reads the file install-cni installs: the same volume
	mountOf := func(c map[string]any) string {
		ms, _, _ := unstructured.NestedSlice(c, "volumeMounts")
		for _, m := range ms {
			if m := m.(map[string]any); m["name"] == "conflist" {
				return fmt.Sprint(m["mountPath"], " readOnly=", m["readOnly"])
			}
		}
		return ""
	}
	if got, initGot := mountOf(agent), mountOf(inits[0].(map[string]any)); got != "/etc/ipledger readOnly=true" || got != initGot {
		t.Errorf("the agent mounts the conflist volume at %q, install-cni at %q; want both at /etc/ipledger, read-only", got, initGot)
	}
	if c := fmt.Sprint(inits[0].(map[string]any)["command"]); !strings.Contains(c, "--conflist /etc/ipledger/ipledger.conflist") {
		t.Errorf("install-cni command %s does not install /etc/ipledger/ipledger.conflist", c)
	}
	conf, err := ipam.FromConflist([]byte(conflist))
	if err != nil {
		t.Fatalf("deploy/cluster's conflist: %v", err)
	}
	sets := conf.IPAM.RangeSets()
	if pool.HasPodCIDR(sets) {
		t.Fatalf("deploy/cluster's conflist ranges %s: usePodCidr in cluster mode", pool.SetsString(sets))
	}
	if _, err := cluster.BlockBits(sets, conf.IPAM.BlockSize); err != nil {
		t.Fatalf("deploy/cluster's conflist: %v", err)
	}
}

// kustomize returns the objects of deploy/<overlay> as kubectl apply -k builds
// them (kubectl's own kustomize).
func kustomize(t *testing.T, overlay string) []*unstructured.Unstructured {
	t.Helper()
	kubectl := filepath.Join(kubeenv.Binaries(t), "kubectl")
	out, err := exec.Command(kubectl, "kustomize", filepath.Join(filepath.Dir(manifestPath), overlay)).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize deploy/%s: %v\n%s", overlay, err, out)
	}
	docs, err := kubeds.Documents(out)
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

// foldSpace is v with every run of white space in its strings made one space.
func foldSpace(v any) any {
	switch x := v.(type) {
	case string:
		return strings.Join(strings.Fields(x), " ")
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			out[k] = foldSpace(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = foldSpace(e)
		}
		return out
	}
	return v
}

func decodeConflist(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("conflist: %v\n%s", err, s)
	}
	return m
}
