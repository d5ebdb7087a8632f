//go:build conformance

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
)

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
// mode and in cluster mode, each its own cluster. It writes each mode's
// summary into docs/conformance.md and fails when any selected test fails.
func TestConformance(t *testing.T) {
	skipPath := filepath.Join(agentenv.RepoRoot(), "test", "kubenodes", "testdata", "upstream-skip.txt")
	skips, err := e2eenv.SkipList(skipPath)
	if err != nil {
		t.Fatal(err)
	}
	focus := conformanceSelection
	if *conformanceFocus != "" {
		focus = []string{*conformanceFocus}
	}
	for _, mode := range strings.Split(*conformanceModes, ",") {
		t.Run(mode, func(t *testing.T) {
			dir := filepath.Join(os.TempDir(), "ipledger-conformance-"+mode)
			os.RemoveAll(dir)
			t0 := time.Now()
			rep := nodesenv.Upstream(t, mode == "cluster", e2eenv.Options{Focus: focus, Skip: skips, Procs: *conformanceProcs, Timeout: 3 * time.Hour, Dir: dir})
			for _, s := range rep.Ran() {
				if s.State == "failed" {
					t.Errorf("failed: %s\n%s", s.Name, s.Failure)
				}
			}
			if *conformanceFocus == "" {
				if err := writeSummary(mode, rep, time.Since(t0), skipPath); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// writeSummary replaces mode's section of docs/conformance.md.
func writeSummary(mode string, rep e2eenv.Report, total time.Duration, skipPath string) error {
	p := filepath.Join(agentenv.RepoRoot(), "docs", "conformance.md")
	var b strings.Builder
	// the default release keeps the mode's section; another release (kubeenv.VersionEnv) has its own
	section, title := mode, mode+" mode"
	if kubeenv.Version != kubeenv.DefaultVersion {
		section, title = mode+" "+kubeenv.Version, mode+" mode, Kubernetes "+kubeenv.Version
	}
	begin, end := "<!-- begin "+section+" -->", "<!-- end "+section+" -->"
	fmt.Fprintf(&b, "%s\n### %s\n\n", begin, title)
	ctd, err := containerdenv.Selected()
	if err != nil {
		return err
	}
	fmt.Fprintf(&b, "Kubernetes %s e2e suite on containerd %s, %s; run %s; %d passed, %d failed, %d skipped by the test itself (reason in the table), %d not selected or skipped by the list; the suite took %v, the whole run (cluster, images, CoreDNS, suite) %v.\n\n",
		kubeenv.Version, ctd, installOf(mode), time.Now().UTC().Format("2006-01-02"), rep.Count("passed"), rep.Count("failed"), rep.Count("skipped in run"), rep.Count("skipped"),
		rep.Duration.Round(time.Second), total.Round(time.Second))
	b.WriteString("| result | seconds | test |\n|---|---:|---|\n")
	for _, s := range rep.Ran() {
		name := strings.ReplaceAll(s.Name, "|", `\|`)
		if s.State == "skipped in run" {
			name += " (" + strings.ReplaceAll(s.Failure, "|", `\|`) + ")"
		}
		fmt.Fprintf(&b, "| %s | %.0f | %s |\n", s.State, s.Seconds, name)
	}
	fmt.Fprintf(&b, "\nSkip list: %s.\n%s\n", filepath.ToSlash(strings.TrimPrefix(skipPath, agentenv.RepoRoot()+"/")), end)
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

func installOf(mode string) string {
	if mode == "cluster" {
		return "ipledger installed with kubectl apply -k deploy/cluster"
	}
	return "ipledger installed with kubectl apply -f deploy/ipledger.yaml"
}
