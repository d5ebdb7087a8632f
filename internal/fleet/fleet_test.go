package fleet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ctl"
	"github.com/ipledger/ipledger/internal/fleet"
	"github.com/ipledger/ipledger/internal/image"
)

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// agent is one node's agent as the fake cluster runs it: ipledgerctl's own Main
// (internal/ctl) over canned answers of the agent, so what the plugin reads is what
// ipledgerctl prints in a real pod.
type agent struct {
	leases []api.LeaseView
	audit  *api.Audit
	doctor *api.Diagnosis
	blocks *api.Cluster
}

func (a *agent) call(_ context.Context, _ string, req api.Request) (*api.Response, error) {
	switch req.Op {
	case api.OpLeases:
		return &api.Response{Leases: a.leases}, nil
	case api.OpAudit:
		return &api.Response{Audit: a.audit}, nil
	case api.OpDoctor:
		return &api.Response{Doctor: a.doctor}, nil
	case api.OpBlocks:
		return &api.Response{Cluster: a.blocks}, nil
	}
	return nil, fmt.Errorf("op %s", req.Op)
}

// fakeCluster is a Lister and an Exec: the nodes, the agent pods, and each pod's
// agent. An exec into a pod in forbid is refused as the API server's RBAC does.
type fakeCluster struct {
	nodes    []string
	nodesErr error
	pods     []fleet.Pod
	podsErr  error
	dsErr    error
	agents   map[string]*agent // by pod name
	forbid   map[string]bool   // by pod name
	broken   map[string]bool   // by pod name: ipledgerctl cannot reach its agent

	mu    sync.Mutex
	execs []string // "namespace/pod/container: cmd"
}

var (
	_ fleet.Lister = (*fakeCluster)(nil)
	_ fleet.Exec   = (*fakeCluster)(nil)
)

func (f *fakeCluster) Nodes(context.Context) ([]string, error) { return f.nodes, f.nodesErr }

// dsUID is the UID of the fake cluster's DaemonSet ipledger/ipledgerd.
const dsUID = "6c1b6a2e-0d4f-4c59-9a39-3f1d2e5b7a10"

// dsOwner is the controller owner reference of the DaemonSet's pods.
var dsOwner = fleet.Owner{APIVersion: "apps/v1", Kind: "DaemonSet", Name: fleet.DefaultDaemonSet, UID: dsUID}

func (f *fakeCluster) DaemonSetUID(_ context.Context, namespace, name string) (string, error) {
	if f.dsErr != nil {
		return "", f.dsErr
	}
	if namespace != fleet.DefaultNamespace || name != fleet.DefaultDaemonSet {
		return "", fmt.Errorf(`%w: daemonsets.apps %q not found`, fleet.ErrNoDaemonSet, name)
	}
	return dsUID, nil
}

func (f *fakeCluster) Pods(_ context.Context, namespace, selector string) ([]fleet.Pod, error) {
	if namespace != fleet.DefaultNamespace || selector != fleet.DefaultSelector {
		return nil, nil
	}
	return f.pods, f.podsErr
}

func (f *fakeCluster) Exec(_ context.Context, namespace, pod, container string, cmd []string) ([]byte, []byte, int, error) {
	f.mu.Lock()
	f.execs = append(f.execs, fmt.Sprintf("%s/%s/%s: %s", namespace, pod, container, strings.Join(cmd, " ")))
	f.mu.Unlock()
	if f.forbid[pod] {
		return nil, nil, 0, fmt.Errorf("%w (unable to upgrade connection: pods %q is forbidden: User \"viewer\" cannot create resource \"pods/exec\" in API group \"\" in the namespace %q)", fleet.ErrForbidden, pod, namespace)
	}
	a, ok := f.agents[pod]
	if !ok || container != fleet.DefaultContainer {
		return nil, nil, 0, fmt.Errorf("container %q not found in pod %s", container, pod)
	}
	if cmd[0] != fleet.AgentCtl {
		return nil, []byte("exec: " + cmd[0] + ": not found"), 127, nil
	}
	var stdout, stderr bytes.Buffer
	call := a.call
	if f.broken[pod] {
		call = func(context.Context, string, api.Request) (*api.Response, error) {
			return nil, errors.New("dial unix /run/ipledger/ipledger.sock: connect: no such file or directory")
		}
	}
	exit := ctl.Main(&ctl.Env{Stdout: &stdout, Stderr: &stderr, Call: call, Now: func() time.Time { return now },
		Loopback: func(string) (bool, error) { return true, nil }}, cmd[1:])
	return stdout.Bytes(), stderr.Bytes(), exit, nil
}

func balanced(live int) *api.Audit {
	return &api.Audit{OK: true, Live: live, Runtime: "ok", Problems: []string{},
		Pools: []api.PoolAudit{{Network: "k8s-pod-network", Allocations: uint64(live) + 2, Releases: 2, Live: uint64(live), Free: 253 - uint64(live)}}}
}

func healthy() *api.Diagnosis {
	return &api.Diagnosis{Runtime: "ok", RuntimeVersion: "containerd 1.7.24", BooksBalanced: true, Now: now}
}

func lease(ip, pod string) api.LeaseView {
	return api.LeaseView{Network: "k8s-pod-network", ContainerID: strings.Repeat("a", 64), IfName: "eth0", IPs: []string{ip + "/24"},
		Namespace: "default", Name: pod, Created: now.Add(-5 * time.Minute), State: "live", Sandbox: "READY", PodPhase: "Running", PodInAPI: api.PodInAPIYes}
}

func one(n int) *int { return &n }

// threeNodes: node0..node2, each with its Running agent pod and one pod's lease.
func threeNodes() *fakeCluster {
	f := &fakeCluster{nodes: []string{"node2", "node0", "node1"}, agents: map[string]*agent{}}
	for i := range 3 {
		node, pod := fmt.Sprintf("node%d", i), fmt.Sprintf("ipledgerd-%c", 'a'+i)
		f.pods = append(f.pods, fleet.Pod{Name: pod, Node: node, Phase: "Running", Created: now.Add(-time.Hour), Owner: dsOwner})
		f.agents[pod] = &agent{
			leases: []api.LeaseView{lease(fmt.Sprintf("10.244.%d.5", i), "web-"+node)},
			audit:  balanced(1),
			doctor: healthy(),
			blocks: &api.Cluster{Node: node, Datastore: "kubernetes"},
		}
	}
	return f
}

type run struct {
	code           int
	stdout, stderr string
}

func (f *fakeCluster) run(t *testing.T, args ...string) run {
	t.Helper()
	var stdout, stderr bytes.Buffer
	env := &fleet.Env{Stdout: &stdout, Stderr: &stderr, Now: func() time.Time { return now },
		Connect: func(clientcmd.ClientConfig) (*fleet.Client, error) { return &fleet.Client{Lister: f, Exec: f}, nil }}
	code := fleet.Main(env, args)
	t.Logf("kubectl ipledger %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	return run{code, stdout.String(), stderr.String()}
}

// lines: the table's rows with their columns split on runs of spaces.
func lines(s string) [][]string {
	var rows [][]string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		rows = append(rows, strings.Fields(l))
	}
	return rows
}

func TestAuditBalancedTable(t *testing.T) {
	f := threeNodes()
	r := f.run(t, "audit")
	if r.code != fleet.ExitOK || r.stderr != "" {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	rows := lines(r.stdout)
	want := [][]string{
		{"NODE", "BOOKS", "LIVE", "SUSPECT", "STRANDED", "LEAKED", "DOUBLE-ASSIGNED", "RUNTIME"},
		{"node0", "BALANCED", "1", "0", "0", "0", "0", "ok"},
		{"node1", "BALANCED", "1", "0", "0", "0", "0", "ok"},
		{"node2", "BALANCED", "1", "0", "0", "0", "0", "ok"},
	}
	for i, w := range want {
		if !slices.Equal(rows[i], w) {
			t.Errorf("row %d: %q, want %q", i, rows[i], w)
		}
	}
	if !strings.Contains(r.stdout, "node1: pool k8s-pod-network: 3 allocations = 2 releases + 1 live; 252 free") {
		t.Errorf("no pool books of node1")
	}
	for _, e := range f.execs {
		if !strings.HasPrefix(e, "ipledger/ipledgerd-") || !strings.HasSuffix(e, "/ipledgerd: /usr/local/bin/ipledgerctl audit -o json") {
			t.Errorf("exec %q", e)
		}
	}
	if len(f.execs) != 3 {
		t.Errorf("%d execs, want 3", len(f.execs))
	}
}

func TestAuditUnbalancedExits1(t *testing.T) {
	f := threeNodes()
	a := f.agents["ipledgerd-b"]
	a.audit.OK, a.audit.Problems = false, []string{"pool k8s-pod-network: 3 allocations != 1 releases + 1 live"}
	r := f.run(t, "audit")
	if r.code != fleet.ExitUnbalanced {
		t.Fatalf("exit %d, want %d", r.code, fleet.ExitUnbalanced)
	}
	if !slices.Equal(lines(r.stdout)[2][:3], []string{"node1", "NOT", "BALANCED"}) {
		t.Errorf("node1's row: %q", lines(r.stdout)[2])
	}
	if !strings.Contains(r.stdout, "node1: books: pool k8s-pod-network: 3 allocations != 1 releases + 1 live") {
		t.Errorf("node1's problem not explained")
	}
}

// TestUnreachableNodes: a node without an agent pod, a pod not running, an exec RBAC
// refuses and an agent whose socket does not answer each name their node and cause
// on stderr and exit 3, over an unbalanced node's 1; the other nodes are answered.
func TestUnreachableNodes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(f *fakeCluster)
		stderr string
	}{
		{"no agent pod", func(f *fakeCluster) {
			f.pods = slices.DeleteFunc(f.pods, func(p fleet.Pod) bool { return p.Node == "node1" })
		}, "node node1: no agent pod on node node1 (namespace ipledger, selector app=ipledgerd)"},
		{"pending", func(f *fakeCluster) { f.pods[1].Phase = "Pending" },
			"node node1: agent pod not running: pod ipledger/ipledgerd-b is Pending"},
		{"exec forbidden", func(f *fakeCluster) { f.forbid = map[string]bool{"ipledgerd-b": true} },
			"node node1: exec in pod ipledger/ipledgerd-b refused: it needs create on pods/exec in namespace ipledger (RBAC)"},
		{"agent down", func(f *fakeCluster) { f.broken = map[string]bool{"ipledgerd-b": true} },
			"node node1: no answer from ipledgerctl: /usr/local/bin/ipledgerctl audit -o json in pod ipledger/ipledgerd-b exited 2: ipledgerctl: dial unix /run/ipledger/ipledger.sock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := threeNodes()
			f.agents["ipledgerd-c"].audit.OK = false
			tc.change(f)
			r := f.run(t, "audit")
			if r.code != fleet.ExitUnreachable || !strings.Contains(r.stderr, tc.stderr) {
				t.Fatalf("exit %d, want %d; stderr wants %q", r.code, fleet.ExitUnreachable, tc.stderr)
			}
			rows := lines(r.stdout)
			if !slices.Equal(rows[2][:2], []string{"node1", "UNREACHABLE"}) || rows[1][1] != "BALANCED" || rows[3][1] != "NOT" {
				t.Errorf("rows %q", rows)
			}
			var list []fleet.NodeResult
			if err := json.Unmarshal([]byte(f.run(t, "audit", "-o", "json").stdout), &list); err != nil {
				t.Fatal(err)
			}
			if len(list) != 3 || list[1].Status != fleet.StatusUnreachable || list[1].Error == "" || list[1].Result != nil || list[2].Status != fleet.StatusUnbalanced {
				t.Errorf("-o json: %+v", list)
			}
		})
	}
}

// TestPluginErrorsExit4: the plugin's own failures (the agent pods or their DaemonSet
// not read, usage) exit 4, which no node's answer gives: a script tells them from a
// doctor FAIL (2) or an unreachable node (3).
func TestPluginErrorsExit4(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(f *fakeCluster)
		stderr string
	}{
		{"pods forbidden", func(f *fakeCluster) {
			f.podsErr = fmt.Errorf(`%w: pods is forbidden: User "nobody" cannot list resource "pods" in API group "" in the namespace "ipledger"`, fleet.ErrForbidden)
		}, "needs list on pods in namespace ipledger"},
		{"daemonset forbidden", func(f *fakeCluster) {
			f.dsErr = fmt.Errorf(`%w: daemonsets.apps "ipledgerd" is forbidden: User "viewer" cannot get resource "daemonsets"`, fleet.ErrForbidden)
		}, "needs get on daemonsets (apps) in namespace ipledger (RBAC)"},
		{"no daemonset", func(f *fakeCluster) {
			f.dsErr = fmt.Errorf(`%w: daemonsets.apps "ipledgerd" not found`, fleet.ErrNoDaemonSet)
		}, "no DaemonSet ipledger/ipledgerd: is ipledger installed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := threeNodes()
			tc.change(f)
			for _, cmd := range []string{"audit", "doctor"} {
				r := f.run(t, cmd)
				if r.code != fleet.ExitPlugin || !strings.Contains(r.stderr, tc.stderr) {
					t.Fatalf("%s: exit %d, want %d naming %q", cmd, r.code, fleet.ExitPlugin, tc.stderr)
				}
			}
			if len(f.execs) != 0 {
				t.Errorf("execs %q", f.execs)
			}
		})
	}
	// distinct from every node-borne status
	if len(map[int]bool{fleet.ExitOK: true, fleet.ExitUnbalanced: true, fleet.ExitError: true, fleet.ExitUnreachable: true, fleet.ExitPlugin: true}) != 5 {
		t.Fatal("two exit statuses share a value")
	}
}

// TestOnlyDaemonSetPodsAsked: a pod that matches the agents' selector but that the
// agents' DaemonSet does not own (a pod someone made with the label, a DaemonSet of the
// same name deleted and made again: another UID, a pod whose controller is a
// ReplicaSet) is never exec'd into: its node is unreachable (exit 3) naming the pod
// and its owner; where the node also has the DaemonSet's pod, that one is asked and
// the stranger named on stderr.
func TestOnlyDaemonSetPodsAsked(t *testing.T) {
	for _, tc := range []struct {
		name  string
		owner fleet.Owner
	}{
		{"no owner", fleet.Owner{}},
		{"another uid", fleet.Owner{APIVersion: "apps/v1", Kind: "DaemonSet", Name: fleet.DefaultDaemonSet, UID: "0a0a0a0a-old"}},
		{"another daemonset", fleet.Owner{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "impostor", UID: dsUID}},
		{"a replicaset", fleet.Owner{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: fleet.DefaultDaemonSet, UID: dsUID}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := threeNodes()
			f.pods[1].Owner = tc.owner // ipledgerd-b on node1
			// and a stranger beside the DaemonSet's pod on node2, newer and Running
			f.pods = append(f.pods, fleet.Pod{Name: "debug-x", Node: "node2", Phase: "Running", Created: now, Owner: tc.owner})
			f.agents["debug-x"] = &agent{audit: balanced(7)}
			r := f.run(t, "audit")
			if r.code != fleet.ExitUnreachable || !strings.Contains(r.stderr, "node node1: no pod of the agents' DaemonSet on node node1: pod ipledger/ipledgerd-b matches app=ipledgerd but its owner is "+tc.owner.String()) {
				t.Fatalf("exit %d, want %d naming node1's pod and its owner", r.code, fleet.ExitUnreachable)
			}
			if !strings.Contains(r.stderr, "pod ipledger/debug-x on node node2 matches app=ipledgerd but its owner is "+tc.owner.String()+", not DaemonSet ipledgerd") {
				t.Errorf("the stranger on node2 is not named")
			}
			for _, e := range f.execs {
				if strings.Contains(e, "ipledgerd-b") || strings.Contains(e, "debug-x") {
					t.Errorf("exec into a pod the DaemonSet does not own: %s", e)
				}
			}
			if rows := lines(r.stdout); !slices.Equal(rows[2][:2], []string{"node1", "UNREACHABLE"}) || !slices.Equal(rows[3][:3], []string{"node2", "BALANCED", "1"}) {
				t.Errorf("rows %q", rows)
			}
		})
	}
}

// TestAuditRuntimeUnreachableFails: a node whose agent cannot reach the container
// runtime has books that nothing reconciles: audit exits 1 even when they balance,
// names the node and the fix on stderr, and shows the runtime in its row and its
// status in -o json. Doctor keeps its own verdict (it FAILs the runtime itself).
func TestAuditRuntimeUnreachableFails(t *testing.T) {
	f := threeNodes()
	f.agents["ipledgerd-b"].audit.Runtime = "unreachable"
	r := f.run(t, "audit")
	if r.code != fleet.ExitUnbalanced || !strings.Contains(r.stderr, "node node1: the agent cannot reach the container runtime: nothing is reconciled there") {
		t.Fatalf("exit %d, want %d naming node1's runtime", r.code, fleet.ExitUnbalanced)
	}
	if rows := lines(r.stdout); !slices.Equal(rows[2], []string{"node1", "BALANCED", "1", "0", "0", "0", "0", "unreachable"}) {
		t.Errorf("node1's row %q", rows[2])
	}
	var list []fleet.NodeResult
	if err := json.Unmarshal([]byte(f.run(t, "audit", "-o", "json").stdout), &list); err != nil {
		t.Fatal(err)
	}
	if list[1].Status != fleet.StatusNoRuntime || list[0].Status != fleet.StatusOK {
		t.Errorf("-o json statuses %q %q", list[0].Status, list[1].Status)
	}
	// no runtime configured (--cri-endpoint unset) is the operator's choice, not a failure
	f.agents["ipledgerd-b"].audit.Runtime = "none"
	if r := f.run(t, "audit"); r.code != fleet.ExitOK {
		t.Errorf("runtime none: exit %d", r.code)
	}
}

// TestNodesNotListed: without list on nodes the nodes with an agent pod are still
// asked, with a warning that nodes without one cannot be seen.
func TestNodesNotListed(t *testing.T) {
	f := threeNodes()
	f.nodes, f.nodesErr = nil, fmt.Errorf(`%w: nodes is forbidden`, fleet.ErrForbidden)
	r := f.run(t, "audit")
	if r.code != fleet.ExitOK || len(lines(r.stdout)) < 4 || !strings.Contains(r.stderr, "the Nodes could not be listed") {
		t.Fatalf("exit %d", r.code)
	}
}

func TestLeasesJSONAndYAML(t *testing.T) {
	f := threeNodes()
	r := f.run(t, "leases", "-o", "json")
	if r.code != fleet.ExitOK {
		t.Fatalf("exit %d", r.code)
	}
	var list []struct {
		Node   string            `json:"node"`
		Pod    string            `json:"pod"`
		Status string            `json:"status"`
		Result []api.LeaseView   `json:"result"`
		Extra  map[string]string `json:"-"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 {
		t.Fatalf("%d entries", len(list))
	}
	for i, e := range list {
		node := fmt.Sprintf("node%d", i)
		if e.Node != node || e.Pod != fmt.Sprintf("ipledgerd-%c", 'a'+i) || e.Status != fleet.StatusOK ||
			len(e.Result) != 1 || e.Result[0].IPs[0] != fmt.Sprintf("10.244.%d.5/24", i) || e.Result[0].Name != "web-"+node {
			t.Errorf("entry %d: %+v", i, e)
		}
	}
	y := f.run(t, "leases", "-o", "yaml")
	var fromYAML []fleet.NodeResult
	if err := yaml.Unmarshal([]byte(y.stdout), &fromYAML); err != nil {
		t.Fatal(err)
	}
	if len(fromYAML) != 3 || fromYAML[2].Node != "node2" || !strings.Contains(string(fromYAML[2].Result), "10.244.2.5/24") {
		t.Errorf("-o yaml: %+v", fromYAML)
	}
}

func TestLeasesTable(t *testing.T) {
	f := threeNodes()
	r := f.run(t, "leases")
	rows := lines(r.stdout)
	if !slices.Equal(rows[0], append([]string{"NODE"}, strings.Split(ctl.LeaseHeader, "\t")...)) {
		t.Errorf("header %q", rows[0])
	}
	for i, row := range rows[1:] {
		want := []string{fmt.Sprintf("node%d", i), "k8s-pod-network", "aaaaaaaaaaaaa", "eth0", fmt.Sprintf("10.244.%d.5/24", i), fmt.Sprintf("default/web-node%d", i), "Running", "5m", "READY", "-", "-"}
		if !slices.Equal(row, want) {
			t.Errorf("row %d: %q, want %q", i+1, row, want)
		}
	}
	// --network and --pod go to ipledgerctl
	f.execs = nil
	f.run(t, "leases", "--network", "k8s-pod-network", "--pod", "default/web-node1", "--node", "node1")
	if want := []string{"ipledger/ipledgerd-b/ipledgerd: /usr/local/bin/ipledgerctl leases -o json --network k8s-pod-network --pod default/web-node1"}; !slices.Equal(f.execs, want) {
		t.Errorf("execs %q, want %q", f.execs, want)
	}
}

// TestNodeFlag: --node asks that node's agent only; an unknown node is unreachable.
func TestNodeFlag(t *testing.T) {
	f := threeNodes()
	r := f.run(t, "audit", "--node", "node2")
	if r.code != fleet.ExitOK || lines(r.stdout)[1][0] != "node2" || strings.Contains(r.stdout, "node0") || strings.Contains(r.stdout, "node1") ||
		len(f.execs) != 1 || !strings.Contains(f.execs[0], "ipledgerd-c") {
		t.Fatalf("exit %d, execs %q", r.code, f.execs)
	}
	r = f.run(t, "--node=node9", "audit")
	if r.code != fleet.ExitUnreachable || !strings.Contains(r.stderr, "node node9: no node node9") {
		t.Fatalf("exit %d", r.code)
	}
}

// TestDoctorWorstDecides: every node's checks in one table; the worst level of any
// node is the exit status (doctor's: 1 WARN, 2 FAIL).
func TestDoctorWorstDecides(t *testing.T) {
	f := threeNodes()
	r := f.run(t, "doctor")
	if r.code != fleet.ExitOK {
		t.Fatalf("exit %d", r.code)
	}
	if rows := lines(r.stdout); !slices.Equal(rows[0], []string{"NODE", "LEVEL", "CHECK"}) || !strings.Contains(r.stdout, "node2  OK     runtime reachable: containerd 1.7.24") {
		t.Errorf("table:\n%s", r.stdout)
	}
	f.agents["ipledgerd-a"].doctor.SpoolBacklog = 4
	if r := f.run(t, "doctor"); r.code != 1 || !strings.Contains(r.stdout, "node0  WARN   spool backlog: 4 DELs waiting") {
		t.Errorf("WARN on node0: exit %d", r.code)
	}
	f.agents["ipledgerd-c"].doctor.Runtime, f.agents["ipledgerd-c"].doctor.RuntimeError = "unreachable", "connection refused"
	r = f.run(t, "doctor", "-o", "json")
	var list []struct {
		Node   string           `json:"node"`
		Status string           `json:"status"`
		Result ctl.DoctorOutput `json:"result"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil {
		t.Fatal(err)
	}
	if r.code != 2 || list[0].Status != fleet.StatusWarn || list[2].Status != fleet.StatusFail || list[2].Result.Level != ctl.LevelFail {
		t.Errorf("exit %d, %+v", r.code, list)
	}
}

// TestBlocksEachUnderItsOwner: every node lists the datastore's blocks; the table
// shows each once, under its owner with the owner's counts, a free block under the
// first node.
func TestBlocksEachUnderItsOwner(t *testing.T) {
	f := threeNodes()
	blocks := []struct{ cidr, owner string }{{"10.244.0.0/26", "node0"}, {"10.244.0.64/26", "node1"}, {"10.244.0.128/26", "node2"}, {"10.244.0.192/26", ""}}
	for i := range 3 {
		node, pod := fmt.Sprintf("node%d", i), fmt.Sprintf("ipledgerd-%c", 'a'+i)
		var bs []api.BlockView
		for _, b := range blocks {
			v := api.BlockView{Network: "k8s-pod-network", Block: b.cidr, Owner: b.owner, Epoch: 1, State: api.BlockOther}
			switch b.owner {
			case node:
				v.State, v.Used, v.Free = api.BlockOwned, one(1), one(63)
			case "":
				v.State, v.Epoch = api.BlockFree, 2
			}
			bs = append(bs, v)
		}
		f.agents[pod].blocks.Blocks = bs
	}
	r := f.run(t, "blocks")
	want := [][]string{
		{"NODE", "NETWORK", "BLOCK", "OWNER", "EPOCH", "STATE", "USED", "FREE"},
		{"node0", "k8s-pod-network", "10.244.0.0/26", "node0", "1", "owned", "1", "63"},
		{"node0", "k8s-pod-network", "10.244.0.192/26", "-", "2", "free", "-", "-"},
		{"node1", "k8s-pod-network", "10.244.0.64/26", "node1", "1", "owned", "1", "63"},
		{"node2", "k8s-pod-network", "10.244.0.128/26", "node2", "1", "owned", "1", "63"},
	}
	if rows := lines(r.stdout); r.code != 0 || !slices.EqualFunc(rows, want, slices.Equal) {
		t.Errorf("exit %d, rows %q, want %q", r.code, rows, want)
	}
}

func TestUsage(t *testing.T) {
	f := threeNodes()
	for _, args := range [][]string{{}, {"pools"}, {"audit", "-o", "wide"}, {"audit", "extra"}, {"audit", "--network", "x"}, {"--bogus", "audit"}} {
		if r := f.run(t, args...); r.code != fleet.ExitPlugin || r.stderr == "" {
			t.Errorf("%q: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
	if r := f.run(t, "--help"); r.code != fleet.ExitOK || !strings.Contains(r.stderr, "--kubeconfig") || !strings.Contains(r.stderr, "--as ") {
		t.Errorf("--help: exit %d", r.code)
	}
	if len(f.execs) != 0 {
		t.Errorf("execs %q", f.execs)
	}
}

// TestAgentCtlInImage: the path the plugin execs is where the image holds ipledgerctl.
func TestAgentCtlInImage(t *testing.T) {
	if !slices.Contains(image.Binaries, "ipledgerctl") || fleet.AgentCtl != image.BinDir+"/ipledgerctl" {
		t.Fatalf("AgentCtl %s; the image holds %q in %s", fleet.AgentCtl, image.Binaries, image.BinDir)
	}
}

// TestKubeconfigLikeKubectl: the kubeconfig is found as kubectl finds it
// (--kubeconfig over KUBECONFIG) and --context, --as and --as-group apply; -n names
// the agents' namespace, not the context's.
func TestKubeconfigLikeKubectl(t *testing.T) {
	dir := t.TempDir()
	kc := func(name, server string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- {name: a, cluster: {server: %[1]s}}
- {name: b, cluster: {server: %[1]s-b}}
users:
- {name: u, user: {token: t}}
contexts:
- {name: one, context: {cluster: a, user: u, namespace: default}}
- {name: two, context: {cluster: b, user: u}}
current-context: one
`, server)), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fromEnv, fromFlag := kc("env", "https://env.example:6443"), kc("flag", "https://flag.example:6443")
	t.Setenv("KUBECONFIG", fromEnv)
	for _, tc := range []struct {
		args           []string
		host, as       string
		groups         []string
		agentNamespace string
	}{
		{[]string{"audit"}, "https://env.example:6443", "", nil, "ipledger"},
		{[]string{"audit", "--kubeconfig", fromFlag}, "https://flag.example:6443", "", nil, "ipledger"},
		{[]string{"audit", "--context", "two", "--as", "viewer", "--as-group", "g1"}, "https://env.example:6443-b", "viewer", []string{"g1"}, "ipledger"},
		{[]string{"audit", "-n", "kube-system"}, "https://env.example:6443", "", nil, "kube-system"},
	} {
		var stdout, stderr bytes.Buffer
		var host, as string
		var groups []string
		f := threeNodes()
		env := &fleet.Env{Stdout: &stdout, Stderr: &stderr, Connect: func(cfg clientcmd.ClientConfig) (*fleet.Client, error) {
			rc, err := cfg.ClientConfig()
			if err != nil {
				return nil, err
			}
			host, as, groups = rc.Host, rc.Impersonate.UserName, rc.Impersonate.Groups
			return &fleet.Client{Lister: f, Exec: f}, nil
		}}
		fleet.Main(env, tc.args)
		if host != tc.host || as != tc.as || !slices.Equal(groups, tc.groups) {
			t.Errorf("%q: server %q as %q %q, want %q as %q %q (%s)", tc.args, host, as, groups, tc.host, tc.as, tc.groups, stderr.String())
		}
		if ns := tc.agentNamespace; ns == fleet.DefaultNamespace && len(f.execs) != 3 || ns != fleet.DefaultNamespace && len(f.execs) != 0 {
			t.Errorf("%q: execs %q", tc.args, f.execs)
		}
	}
}
