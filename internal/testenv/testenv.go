// Package testenv holds what the test environments in its subpackages share: the
// fast tier's skip and its sizes.
//
// `go test -short ./...` is the fast tier: it leaves out the tests that need a
// Kubernetes build, a private containerd or an apt installation, and runs every
// other test. The environments that provide those resources (kubeenv, containerdenv,
// debpkg) call SkipIfShort as their first step, so a test needs no skip of its own.
// Without -short nothing is skipped: the full `go test ./...`, `make test` and CI
// run everything.
package testenv

import "testing"

// SkipIfShort skips tb under `go test -short`, saying what the test needs (for
// example "needs a Kubernetes build"). Outside a test binary (a command using an
// environment, such as test/demo) and without -short it does nothing.
func SkipIfShort(tb testing.TB, needs string) {
	tb.Helper()
	if testing.Testing() && testing.Short() {
		tb.Skip("-short: " + needs)
	}
}

// Size is full, or short under `go test -short`: the size of a long loop
// (chaos, soak, crash points) in the fast tier, small but still meeting every
// fault the loop injects; the full size runs in `make test`.
func Size(full, short int) int {
	if testing.Testing() && testing.Short() {
		return short
	}
	return full
}
