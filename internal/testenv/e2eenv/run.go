package e2eenv

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// Options says what to run and where.
type Options struct {
	// Kubeconfig is the admin kubeconfig; Kubectl the kubectl binary the
	// suite may run.
	Kubeconfig, Kubectl string
	// Netns names the network namespace (under /run/netns) the suite runs in:
	// it must reach the apiserver at the kubeconfig's address
	// (kubeenv.Cluster.RelayAPI) and the nodes' addresses.
	Netns string
	// Focus and Skip are ginkgo regular expressions; each list is joined
	// with |.
	Focus, Skip []string
	// Procs is ginkgo's parallelism (default 1).
	Procs int
	// ClusterNodes is the number of nodes (--num-nodes): with the skeleton
	// provider the suite does not count them, and skips every test that
	// "requires at least 2 nodes" unless told.
	ClusterNodes int
	// Timeout bounds the whole run (default 1h).
	Timeout time.Duration
	// Dir receives the JUnit report, the suite's output and its log.
	Dir string
}

// Spec is one test of a report.
type Spec struct {
	Name string
	// State is passed, failed, skipped (not selected, or by the skip list),
	// "skipped in run" (selected; the test skipped itself, Failure says why)
	// or setup (the suite's own nodes, when they passed).
	State   string
	Seconds float64
	Failure string
}

// Report is the outcome of a run.
type Report struct {
	Specs    []Spec
	Duration time.Duration
	// JUnit is the report's path.
	JUnit string
}

// Count returns how many specs ended in state.
func (r Report) Count(state string) int {
	n := 0
	for _, s := range r.Specs {
		if s.State == state {
			n++
		}
	}
	return n
}

// Ran is the tests that were selected and ran (passed, failed, or skipped
// by themselves; the suite's setup only when it failed), by name.
func (r Report) Ran() []Spec {
	var out []Spec
	for _, s := range r.Specs {
		if s.State == "passed" || s.State == "failed" || s.State == "skipped in run" {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Run runs e2e.test under ginkgo in o.Netns with the skeleton provider and
// returns its JUnit report. The suite's exit status is not an error: the
// report says what failed. The process group is killed by PID when the run
// outlives o.Timeout or the test ends.
func Run(tb testing.TB, o Options) Report {
	tb.Helper()
	e2e, ginkgo := kubeenv.E2ETest(tb)
	if o.Procs <= 0 {
		o.Procs = 1
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Hour
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	args := []string{"netns", "exec", o.Netns, ginkgo,
		fmt.Sprintf("--procs=%d", o.Procs), "--no-color", "--timeout=" + o.Timeout.String(),
		"--output-dir=" + o.Dir, "--junit-report=junit.xml",
		"--focus=" + strings.Join(o.Focus, "|")}
	if len(o.Skip) > 0 {
		args = append(args, "--skip="+strings.Join(o.Skip, "|"))
	}
	args = append(args, e2e, "--",
		"--kubeconfig="+o.Kubeconfig, "--kubectl-path="+o.Kubectl, "--provider=skeleton",
		"--e2e-output-dir="+o.Dir, "--dump-logs-on-failure=false", "--allowed-not-ready-nodes=0",
		fmt.Sprintf("--num-nodes=%d", o.ClusterNodes))
	logPath := filepath.Join(o.Dir, "e2e.log")
	lf, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	defer lf.Close()
	cmd := exec.Command("ip", args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	// The suite's specs write temporary files they do not all remove (kubectl's
	// test-kuberc* kubeconfigs, one a spec): they go to the test's own temp dir.
	cmd.Env = append(os.Environ(), "TMPDIR="+tb.TempDir())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	pgid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	timer := time.NewTimer(o.Timeout + 2*time.Minute)
	defer timer.Stop()
	select {
	case err = <-done:
	case <-timer.C:
		syscall.Kill(-pgid, syscall.SIGKILL)
		err = <-done
		tb.Errorf("e2eenv: the suite outlived %v; killed", o.Timeout)
	}
	// Whatever ginkgo left in its group (its parallel processes) goes too.
	syscall.Kill(-pgid, syscall.SIGKILL)
	rep := Report{Duration: time.Since(t0), JUnit: filepath.Join(o.Dir, "junit.xml")}
	specs, perr := readJUnit(rep.JUnit)
	if perr != nil {
		tb.Fatalf("e2eenv: suite exited (%v) without a report: %v\n%s", err, perr, tailFile(logPath, 60))
	}
	rep.Specs = specs
	tb.Logf("e2eenv: %d passed, %d failed, %d skipped in %v (exit: %v); log %s",
		rep.Count("passed"), rep.Count("failed"), rep.Count("skipped"), rep.Duration.Round(time.Second), err, logPath)
	if p := rep.problem(err); p != "" {
		tb.Errorf("e2eenv: %s; log %s\n%s", p, logPath, tailFile(logPath, 40))
	}
	return rep
}

// problem says why a run whose report lists no failed test still failed, ""
// when it did not: no selected test ran (the suite was cut short, or the
// selection matches nothing), or the suite exited with an error its report
// does not account for.
func (r Report) problem(exit error) string {
	switch {
	case len(r.Ran()) == 0:
		return fmt.Sprintf("no selected test ran (exit: %v)", exit)
	case exit != nil && r.Count("failed") == 0:
		return fmt.Sprintf("the suite exited with %v, and its report names no failed test", exit)
	}
	return ""
}

type junitSuites struct {
	Suites []struct {
		Cases []struct {
			Name    string  `xml:"name,attr"`
			Status  string  `xml:"status,attr"`
			Time    float64 `xml:"time,attr"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
			Failure *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Error *struct {
				Message string `xml:"message,attr"`
			} `xml:"error"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// suiteNode names the suite's setup and report nodes in a JUnit report.
var suiteNode = regexp.MustCompile(`^\[(Synchronized)?(Before|After)Suite\]|^\[Report(Before|After)Suite\]`)

// readJUnit reads ginkgo's JUnit report: every spec, with the suite's setup
// nodes ([SynchronizedBeforeSuite] and the like) among them.
func readJUnit(p string) ([]Spec, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	var js junitSuites
	if err := xml.Unmarshal(b, &js); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	var specs []Spec
	for _, s := range js.Suites {
		for _, c := range s.Cases {
			sp := Spec{Name: strings.TrimSpace(strings.TrimPrefix(c.Name, "[It]")), Seconds: c.Time, State: "passed"}
			switch {
			case c.Skipped != nil && strings.TrimSpace(c.Skipped.Message) != "skipped":
				// selected, then skipped by the test itself: the reason follows
				sp.State, sp.Failure = "skipped in run", strings.TrimPrefix(strings.TrimSpace(c.Skipped.Message), "skipped - ")
			case c.Skipped != nil:
				sp.State = "skipped"
			case c.Failure != nil:
				sp.State, sp.Failure = "failed", c.Failure.Message
			case c.Error != nil:
				sp.State, sp.Failure = "failed", c.Error.Message
			case suiteNode.MatchString(sp.Name):
				sp.State = "setup"
			}
			specs = append(specs, sp)
		}
	}
	return specs, nil
}

// SkipList reads a skip list: one ginkgo regular expression per line, then
// "#" and the reason (required); blank lines and lines starting with # are
// comments.
func SkipList(p string) ([]string, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for ln := 1; sc.Scan(); ln++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		re, reason, ok := strings.Cut(l, " # ")
		if !ok || strings.TrimSpace(reason) == "" {
			return nil, fmt.Errorf("%s:%d: %q has no reason: write REGEXP # WHY", p, ln, l)
		}
		out = append(out, strings.TrimSpace(re))
	}
	return out, sc.Err()
}

func tailFile(p string, n int) string {
	b, _ := os.ReadFile(p)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
