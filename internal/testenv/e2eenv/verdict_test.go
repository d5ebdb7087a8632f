package e2eenv

import (
	"errors"
	"testing"
)

// A run is failed by its report's failed tests, and also when nothing it
// selected ran or when the suite exited with an error no failed test explains
// (ginkgo interrupted or killed: its report is then empty or partial).
func TestReportProblem(t *testing.T) {
	exit1 := errors.New("exit status 1")
	passed := Spec{Name: "a", State: "passed"}
	failed := Spec{Name: "b", State: "failed"}
	for _, c := range []struct {
		name  string
		specs []Spec
		exit  error
		bad   bool
	}{
		{"all passed", []Spec{passed}, nil, false},
		{"a failed test explains the exit", []Spec{passed, failed}, exit1, false},
		{"interrupted: empty report", nil, exit1, true},
		{"nothing selected ran", []Spec{{Name: "c", State: "skipped"}}, nil, true},
		{"exit without a failed test", []Spec{passed}, exit1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := Report{Specs: c.specs}.problem(c.exit)
			if (p != "") != c.bad {
				t.Fatalf("problem %q, want a problem: %v", p, c.bad)
			}
		})
	}
}
