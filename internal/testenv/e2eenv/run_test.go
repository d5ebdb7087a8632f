package e2eenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadJUnit(t *testing.T) {
	p := filepath.Join(t.TempDir(), "junit.xml")
	if err := os.WriteFile(p, []byte(`<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="Kubernetes e2e suite">
<testcase name="[SynchronizedBeforeSuite]" status="passed" time="0.1"></testcase>
<testcase name="[It] [sig-network] A should pass" status="passed" time="15.2"></testcase>
<testcase name="[It] [sig-network] B should fail" status="failed" time="120"><failure message="not reachable">trace</failure></testcase>
<testcase name="[It] [sig-storage] C" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
<testcase name="[It] [sig-network] D needs nodes" status="skipped" time="0"><skipped message="skipped - Requires at least 2 nodes (not -1)"></skipped></testcase>
<testcase name="[ReportAfterSuite] Kubernetes e2e suite report" status="passed" time="0"></testcase>
</testsuite></testsuites>`), 0o644); err != nil {
		t.Fatal(err)
	}
	specs, err := readJUnit(p)
	if err != nil {
		t.Fatal(err)
	}
	r := Report{Specs: specs}
	if r.Count("passed") != 1 || r.Count("failed") != 1 || r.Count("skipped") != 1 || r.Count("setup") != 2 || r.Count("skipped in run") != 1 {
		t.Fatalf("counts: %+v", specs)
	}
	ran := r.Ran()
	if len(ran) != 3 || ran[0].Name != "[sig-network] A should pass" || ran[1].Failure != "not reachable" || ran[2].Failure != "Requires at least 2 nodes (not -1)" {
		t.Fatalf("ran: %+v", ran)
	}
}

func TestSkipListNeedsAReason(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	os.WriteFile(good, []byte("# comment\n\n\\[Feature: # off here\nLoadBalancer # no cloud\n"), 0o644)
	res, err := SkipList(good)
	if err != nil || len(res) != 2 || res[0] != `\[Feature:` {
		t.Fatalf("SkipList = %q, %v", res, err)
	}
	bad := filepath.Join(dir, "bad")
	os.WriteFile(bad, []byte("LoadBalancer\n"), 0o644)
	if _, err := SkipList(bad); err == nil || !strings.Contains(err.Error(), "no reason") {
		t.Fatalf("a line without a reason: %v", err)
	}
}

// TestRepoSkipList: the skip lists make conformance reads (every run's, and
// the dual-stack run's additions) parse, every line with its reason, and
// docs/conformance.md shows every line.
func TestRepoSkipList(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "conformance.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, list := range []string{"upstream-skip.txt", "upstream-skip-dualstack.txt"} {
		res, err := SkipList(filepath.Join(root, "test", "kubenodes", "testdata", list))
		if err != nil || len(res) == 0 {
			t.Fatalf("%s: %d entries, %v", list, len(res), err)
		}
		for _, re := range res {
			if !strings.Contains(string(doc), "| `"+strings.ReplaceAll(re, "|", `\|`)+"` |") {
				t.Errorf("docs/conformance.md does not list the skip %q of %s: update its table", re, list)
			}
		}
	}
}
