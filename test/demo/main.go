package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/ipledger/ipledger/internal/sim"
)

func main() { os.Exit(mainErr()) }

func mainErr() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: run as root (it starts containerd and creates network namespaces)")
		return 2
	}
	tb := &runner{}
	code := func() (code int) {
		// the environment's cleanups run even when a step fails or ^C arrives
		defer tb.cleanup()
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(fatal); !ok {
					panic(r)
				}
				code = 1
			}
		}()
		o := Options{Churn: 150, Faulty: 8, Out: os.Stdout}
		if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			o.Progress = os.Stderr
		}
		books, err := Run(ctx, tb, o)
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			return 1
		}
		PrintBooks(os.Stdout, books)
		fmt.Fprintln(os.Stdout, "\n== ipledgerctl sim --scenario mix --pods 3000 --baseline-pods 300 (simulated, seconds)")
		res, err := sim.Run(ctx, sim.Options{Scenario: "mix", Pods: 3000, Seed: 1, BaselinePods: 300})
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo: sim:", err)
			return 1
		}
		sim.Table(os.Stdout, res)
		return 0
	}()
	if tb.failed {
		return 1
	}
	return code
}

// runner is the testing.TB the test environment is written against, for a
// command: it logs to stderr, fails by unwinding to mainErr, and runs the
// registered cleanups (stop by PID, remove directories) in reverse order.
type runner struct {
	testing.TB // unimplemented methods panic; the environment uses those below
	cleanups   []func()
	failed     bool
}

type fatal struct{}

func (r *runner) Helper()                      {}
func (r *runner) Name() string                 { return "demo" }
func (r *runner) Cleanup(f func())             { r.cleanups = append(r.cleanups, f) }
func (r *runner) Failed() bool                 { return r.failed }
func (r *runner) Log(args ...any)              { fmt.Fprintln(os.Stderr, args...) }
func (r *runner) Logf(f string, args ...any)   { fmt.Fprintf(os.Stderr, f+"\n", args...) }
func (r *runner) Error(args ...any)            { r.failed = true; r.Log(args...) }
func (r *runner) Errorf(f string, args ...any) { r.failed = true; r.Logf(f, args...) }
func (r *runner) Fatal(args ...any)            { r.Error(args...); panic(fatal{}) }
func (r *runner) Fatalf(f string, args ...any) { r.Errorf(f, args...); panic(fatal{}) }
func (r *runner) FailNow()                     { r.failed = true; panic(fatal{}) }
func (r *runner) Fail()                        { r.failed = true }
func (r *runner) Skipped() bool                { return false }
func (r *runner) Setenv(k, v string)           { os.Setenv(k, v) }
func (r *runner) Context() context.Context     { return context.Background() }
func (r *runner) Chdir(string)                 { panic("demo: Chdir not supported") }
func (r *runner) TempDir() string {
	d, err := os.MkdirTemp("", "ipl-demo-")
	if err != nil {
		r.Fatal(err)
	}
	r.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func (r *runner) cleanup() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		func() {
			defer func() { recover() }()
			r.cleanups[i]()
		}()
	}
	r.cleanups = nil
}
