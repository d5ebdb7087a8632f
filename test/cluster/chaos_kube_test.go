package cluster_test

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// chaosKubeAllocs sizes TestChaosKubernetes: small in `go test`, at least 100,000 when
// run by hand:
//
//	go test -run TestChaosKubernetes -timeout 2h ./test/cluster -chaos.kube.allocs 100000
var chaosKubeAllocs = flag.Int("chaos.kube.allocs", 2000, "allocations of TestChaosKubernetes in all")

// kubeQuarantine is the reclaim quarantine of TestChaosKubernetes: several lease TTLs
// (3s), so that a deleted Node's blocks, freed as soon as its lease has run out, are
// told apart from blocks freed by the quarantine.
const kubeQuarantine = 15 * time.Second

// applyNode creates the Node object of an agent.
func applyNode(t *testing.T, kube *kubeenv.APIServer, name string) {
	t.Helper()
	if out, err := kube.KubectlIn([]byte("apiVersion: v1\nkind: Node\nmetadata:\n  name: "+name+"\n"), "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply Node %s: %v %s", name, err, out)
	}
}

// startKubeNode starts one more agent (a node joining) with its Node object.
func startKubeNode(t *testing.T, kube *kubeenv.APIServer, name string, ds []string) *node {
	t.Helper()
	applyNode(t, kube, name)
	addr := netenv.FreeAddr(t)
	args := append(append(append([]string{"--node-name", name, "--metrics-addr", addr}, testTimings...), ds...), hostNetworkOff...)
	return &node{name: name, metrics: addr, Agent: agentenv.Start(t, agentenv.Options{Args: args})}
}

// reclaimLines counts, over the agents' logs, the lines saying that block (a CIDR)
// of owner was reclaimed.
func reclaimLines(t *testing.T, nodes []*node, owner, block string) (count int, by []string) {
	t.Helper()
	for _, n := range nodes {
		b, err := os.ReadFile(n.Log)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, `msg="dead node's block reclaimed"`) && strings.Contains(line, " owner="+owner+" ") && strings.Contains(line, " block="+block+" ") {
				count++
				by = append(by, n.name)
			}
		}
	}
	return count, by
}

// logged reports whether any agent's log has a line containing all of parts.
func logged(t *testing.T, nodes []*node, parts ...string) bool {
	t.Helper()
	for _, n := range nodes {
		b, err := os.ReadFile(n.Log)
		if err != nil {
			t.Fatal(err)
		}
	lines:
		for _, line := range strings.Split(string(b), "\n") {
			for _, p := range parts {
				if !strings.Contains(line, p) {
					continue lines
				}
			}
			return true
		}
	}
	return false
}

// TestChaosKubernetes is TestChaosFaults on the Kubernetes datastore: five ipledgerd
// processes (--datastore kubernetes) against a real kube-apiserver, each with its
// Node object, through rounds of faults, allocations and releases driven
// concurrently through the agents' sockets in every phase and the real
// `ipledgerctl cluster-audit` after every phase (leases live, and again released):
//   - agent kill -9: an agent holding leases is SIGKILLed mid-churn and restarted on
//     its state directory; its leases are all there, none flagged lost;
//   - apiserver restart: the kube-apiserver is stopped (by PID) mid-churn and started
//     again on its etcd data;
//   - pause: an agent holding leases is SIGSTOPped past its lease (3s) and the
//     quarantine (15s); its blocks are reclaimed (epoch bumped) and another node hands
//     their addresses out again; after SIGCONT it flags its leases there lost, the
//     audit shows overlaps only with lost leases, its DELs release them locally and
//     the new owner's leases are all still there;
//   - Node deletion: an agent holding leases is SIGKILLed and its Node object
//     deleted; its blocks are reclaimed once its lease has run out, before the
//     quarantine could have passed, each by exactly one agent (one reclaim in all the
//     agents' logs), with an epoch bump; a fresh node (new name, new Node) joins in
//     its place so that five agents churn on.
//
// The churn's own record and the cluster audit must find no address held twice
// except by a lease its agent flags lost. The proof by hand:
//
//	go test -run TestChaosKubernetes -timeout 2h ./test/cluster -chaos.kube.allocs 100000
func TestChaosKubernetes(t *testing.T) {
	total := *chaosKubeAllocs
	start := time.Now()
	kube := startKube(t)
	ds := []string{"--datastore", "kubernetes", "--kubeconfig", kube.Kubeconfig, "--reclaim-quarantine", kubeQuarantine.String()}
	for i := range 5 {
		applyNode(t, kube, fmt.Sprintf("node-%d", i))
	}
	live := startNodes(t, 5, ds)
	everyone := append([]*node(nil), live...) // for the logs: the removed nodes too
	joined := len(live)
	tally := &chaosTally{}

	kinds := []string{"agent-kill", "apiserver-restart", "pause", "node-delete"}
	rounds := max(1, total/(len(kinds)*3000))
	per := (total + rounds*len(kinds) - 1) / (rounds * len(kinds))
	// phase audits the nodes live at the time of its call
	phase := func(name string, on []*node, during func(), after func()) {
		t.Helper()
		chaosPhase(t, tally, "k", per, name, on, live, during, after)
	}

	for r := range rounds {
		for _, kind := range kinds {
			victim := live[len(tally.phases)%len(live)]
			others := without(live, victim)
			switch kind {
			case "agent-kill":
				fault, check := killAndRestart(t, victim, fmt.Sprint("k", r))
				phase(kind+" "+victim.name, others, fault, check)
			case "apiserver-restart":
				phase(kind, live, func() {
					pid := kube.PID()
					t0 := time.Now()
					kube.Stop()
					time.Sleep(2 * time.Second)
					if err := kube.Start(); err != nil {
						t.Errorf("kube-apiserver start: %v", err)
						return
					}
					t.Logf("kube-apiserver (pid %d) stopped and started again (pid %d) after %v", pid, kube.PID(), time.Since(t0).Round(time.Millisecond))
				}, nil)
			case "pause":
				fault, check := pauseAndResume(t, tally, victim, others[0], func() []*node { return live }, fmt.Sprint(r), kubeQuarantine)
				phase(kind+" "+victim.name, others, fault, check)
			case "node-delete":
				held := hold(t, victim, fmt.Sprint("d", r), 10)
				owned := ownedBy(blocksOf(t, others[0]), victim.name)
				// reclaims of these blocks from the same owner before (a pause) do
				// not count
				reclaimedBefore := map[string]int{}
				for _, b := range owned {
					reclaimedBefore[b.Block], _ = reclaimLines(t, everyone, victim.name, b.Block)
				}
				live = others
				phase(kind+" "+victim.name, live, func() {
					t0 := time.Now()
					victim.Kill()
					if out, err := kube.Kubectl("delete", "node", victim.name); err != nil {
						t.Errorf("kubectl delete node %s: %v %s", victim.name, err, out)
						return
					}
					took := waitBlocksLeave(t, live[0], victim, owned, t0)
					t.Logf("%s killed (holding %d leases) and its Node deleted: its %d blocks reclaimed after %v", victim.name, len(held), len(owned), took.Round(time.Millisecond))
					// the Node watch freed them: the quarantine after the lease (3s)
					// had not passed yet
					if took >= 3*time.Second+kubeQuarantine {
						t.Errorf("%s's blocks reclaimed %v after it stopped: the lease and the quarantine had passed, the Node deletion did not free them", victim.name, took)
					}
					if !logged(t, live, `msg="Node deleted`, "node="+victim.name) {
						t.Errorf("no agent logged the deletion of Node %s", victim.name)
					}
				}, func() {
					for _, b := range owned {
						if c, by := reclaimLines(t, everyone, victim.name, b.Block); c-reclaimedBefore[b.Block] != 1 {
							t.Fatalf("block %s of %s reclaimed %d times after its Node's deletion (all reclaims by %v), want exactly once", b.Block, victim.name, c-reclaimedBefore[b.Block], by)
						}
					}
				})
				// a fresh node joins in its place
				fresh := startKubeNode(t, kube, fmt.Sprintf("node-%d", joined), ds)
				joined++
				everyone = append(everyone, fresh)
				live = append(live, fresh)
			}
		}
	}
	auditPhase(t, tally, "end (the joined nodes too)", live)
	for _, b := range blocksOf(t, live[0]) {
		for _, n := range everyone {
			if b.Owner == n.name && n.PID() == 0 {
				t.Fatalf("deleted node %s owns %s after the run", n.name, b.Block)
			}
		}
	}
	t.Logf("chaos on Kubernetes: %d allocations and %d releases by the churn (besides the leases held through the faults), %d phases %v, %d cluster audits, %d addresses held twice (must be 0), %d overlaps with leases flagged lost, %v",
		tally.adds, tally.dels, len(tally.phases), tally.phases, tally.audits, tally.doubles, tally.lostDouble, time.Since(start).Round(time.Second))
	if tally.doubles != 0 {
		t.Fatal("addresses held twice")
	}
	if tally.adds < int64(total) {
		t.Fatalf("the churn made %d allocations, fewer than the %d asked for", tally.adds, total)
	}
}
