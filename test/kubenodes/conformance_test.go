//go:build kubelet && conformance

package kubenodes_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/containerdenv"
	"github.com/ipledger/ipledger/internal/testenv/e2eenv"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
	"github.com/ipledger/ipledger/internal/testenv/nodesenv"
)

var (
	conformanceModes = flag.String("conformance.modes", "node,cluster", "the install modes to run the suite in: node (deploy/ipledger.yaml), cluster (deploy/cluster)")
	conformanceProcs = flag.Int("conformance.procs", 3, "ginkgo's parallel processes")
	conformanceFocus = flag.String("conformance.focus", "", "replace the selection with this ginkgo regular expression (a rerun of some tests)")
	conformanceDual  = flag.Bool("conformance.dualstack", false, "the dual-stack run: an IPv4/IPv6 cluster, ipledger from deploy/dualstack, the [Feature:IPv6DualStack] tests selected (node mode only)")
)

// dualStackSelection is the dual-stack run's selection: the tests upstream
// tags [Feature:IPv6DualStack], which upstream-skip.txt's \[Feature: line
// takes out of every other run.
var dualStackSelection = []string{`\[Feature:IPv6DualStack\]`}

// featureSkip is the line of upstream-skip.txt the dual-stack run drops.
const featureSkip = `\[Feature:`

// dualStackSkips is the skip list of the dual-stack run: skips without the
// \[Feature: line, then the dual-stack list's own lines.
func dualStackSkips(skips, dual []string) []string {
	var out []string
	for _, s := range skips {
		if s != featureSkip {
			out = append(out, s)
		}
	}
	return append(out, dual...)
}

// conformanceFocus is issue 26's selection: every [sig-network] test tagged
// [Conformance], the network tests of the node conformance suite, the
// Networking Granular Checks, HostPort, Services, Conntrack, DNS and KubeProxy
// (its CLOSE_WAIT test runs a privileged pod: the cluster allows them).
var conformanceSelection = []string{
	`\[sig-network\].*\[Conformance\]`,
	`\[sig-network\].*\[NodeConformance\]`,
	`\[sig-network\] Networking Granular Checks`,
	`\[sig-network\] HostPort`,
	`\[sig-network\] Services`,
	`\[sig-network\] Conntrack`,
	`\[sig-network\] DNS`,
	`\[sig-network\] KubeProxy`,
}

// TestConformance is make conformance (issue 26): Kubernetes' own network
// tests against three nodes with ipledger installed from deploy/, in node
// mode and in cluster mode (with two pools: nodesenv.Setup.TwoPools), each
// its own cluster. It writes each mode's
// summary into docs/conformance.md and fails when any selected test fails.
func TestConformance(t *testing.T) {
	if err := conformanceArgsError(flag.Args()); err != nil {
		t.Fatal(err)
	}
	skipPath := filepath.Join(agentenv.RepoRoot(), "test", "kubenodes", "testdata", "upstream-skip.txt")
	skips, err := e2eenv.SkipList(skipPath)
	if err != nil {
		t.Fatal(err)
	}
	focus, skipPaths, timeout := conformanceSelection, []string{skipPath}, 3*time.Hour
	if *conformanceDual {
		dualPath := filepath.Join(filepath.Dir(skipPath), "upstream-skip-dualstack.txt")
		dual, err := e2eenv.SkipList(dualPath)
		if err != nil {
			t.Fatal(err)
		}
		focus, skips, skipPaths = dualStackSelection, dualStackSkips(skips, dual), append(skipPaths, dualPath)
		// one failure of upstream's "service endpoints using hostNetwork"
		// sleeps 10 hours before it fails: bound the run
		timeout = time.Hour
	}
	if *conformanceFocus != "" {
		focus = []string{*conformanceFocus}
	}
	modes := strings.Split(*conformanceModes, ",")
	for _, mode := range modes {
		if *conformanceDual && mode != "node" { // refused before any cluster starts
			t.Fatalf("-conformance.dualstack with mode %q: the dual-stack run is node mode only (deploy/dualstack; deploy/cluster's pool is IPv4): give -conformance.modes=node", mode)
		}
	}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			name := mode
			if *conformanceDual {
				name += "-dualstack"
			}
			dir := filepath.Join(os.TempDir(), "ipledger-conformance-"+name)
			os.RemoveAll(dir)
			t0 := time.Now()
			// cluster mode runs with two pools: every namespace the suite creates
			// takes its pods' addresses from a second IPPool (issue 34), CoreDNS and
			// default keep deploy/cluster's
			rep := nodesenv.Upstream(t, nodesenv.Setup{ClusterMode: mode == "cluster", TwoPools: mode == "cluster", DualStack: *conformanceDual},
				e2eenv.Options{Focus: focus, Skip: skips, Procs: *conformanceProcs, Timeout: timeout, Dir: dir})
			for _, s := range rep.Ran() {
				if s.State == "failed" {
					t.Errorf("failed: %s\n%s", s.Name, s.Failure)
				}
			}
			if *conformanceFocus == "" {
				if err := writeSummary(mode, *conformanceDual, rep, time.Since(t0), skipPaths); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// writeSummary replaces mode's section of docs/conformance.md (the dual-stack
// run's has its own).
func writeSummary(mode string, dual bool, rep e2eenv.Report, total time.Duration, skipPaths []string) error {
	p := filepath.Join(agentenv.RepoRoot(), "docs", "conformance.md")
	var b strings.Builder
	// the default release keeps the mode's section; another release (kubeenv.VersionEnv) has its own
	section, title := mode, mode+" mode"
	if dual {
		section, title = mode+" dual-stack", mode+" mode, dual-stack"
	}
	if kubeenv.Version != kubeenv.DefaultVersion {
		section, title = section+" "+kubeenv.Version, title+", Kubernetes "+kubeenv.Version
	}
	begin, end := "<!-- begin "+section+" -->", "<!-- end "+section+" -->"
	fmt.Fprintf(&b, "%s\n### %s\n\n", begin, title)
	ctd, err := containerdenv.Selected()
	if err != nil {
		return err
	}
	fmt.Fprintf(&b, "Kubernetes %s e2e suite on containerd %s, %s; run %s; %d passed, %d failed, %d skipped by the test itself (reason in the table), %d not selected or skipped by the list; the suite took %v, the whole run (cluster, images, CoreDNS, suite) %v.\n\n",
		kubeenv.Version, ctd, installOf(mode, dual), time.Now().UTC().Format("2006-01-02"), rep.Count("passed"), rep.Count("failed"), rep.Count("skipped in run"), rep.Count("skipped"),
		rep.Duration.Round(time.Second), total.Round(time.Second))
	b.WriteString("| result | seconds | test |\n|---|---:|---|\n")
	for _, s := range rep.Ran() {
		name := strings.ReplaceAll(s.Name, "|", `\|`)
		if s.State == "skipped in run" {
			name += " (" + strings.ReplaceAll(s.Failure, "|", `\|`) + ")"
		}
		fmt.Fprintf(&b, "| %s | %.0f | %s |\n", s.State, s.Seconds, name)
	}
	var lists []string
	for _, sp := range skipPaths {
		lists = append(lists, filepath.ToSlash(strings.TrimPrefix(sp, agentenv.RepoRoot()+"/")))
	}
	skipLine := "Skip list: " + strings.Join(lists, " and ")
	if dual {
		skipLine = "Selection: `" + strings.Join(dualStackSelection, "|") + "`. Skip lists: " + lists[0] + " without its `" + featureSkip + "` line, then " + strings.Join(lists[1:], ", ")
	}
	fmt.Fprintf(&b, "\n%s.\n%s\n", skipLine, end)
	old, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	re := regexp.MustCompile(`(?s)` + regexp.QuoteMeta(begin) + `.*?` + regexp.QuoteMeta(end))
	var doc string
	if re.Match(old) {
		doc = re.ReplaceAllLiteralString(string(old), strings.TrimSuffix(b.String(), "\n"))
	} else {
		doc = strings.TrimRight(string(old), "\n") + "\n\n" + b.String()
	}
	return os.WriteFile(p, []byte(doc), 0o644)
}

func installOf(mode string, dual bool) string {
	switch {
	case mode == "cluster":
		return fmt.Sprintf("ipledger installed with kubectl apply -k deploy/cluster, then a second IPPool %s (%s) chosen for every namespace the suite creates (a MutatingAdmissionPolicy annotates each with %s; CoreDNS keeps deploy/cluster's pool %s), every pod's address checked against its namespace's pool",
			nodesenv.SecondPoolName, nodesenv.SecondPool, nodesenv.PoolAnnotation, nodesenv.ClusterPool)
	case dual:
		return fmt.Sprintf("an IPv4/IPv6 dual-stack cluster (pods %s, Services %s,%s, each kubelet --node-ip IPv4,IPv6), ipledger installed with kubectl apply -k deploy/dualstack", kubeenv.DefaultClusterCIDR+","+kubeenv.ClusterCIDR6, kubeenv.ServiceCIDR, kubeenv.ServiceCIDR6)
	}
	return "ipledger installed with kubectl apply -f deploy/ipledger.yaml"
}
