package bench

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
)

// runner is the testing.TB that agentenv and containerdenv get when the harness runs
// outside a test (the bench command (test/benchcmd)): Fatal ends the run (Run recovers it), Cleanup
// functions run when Run returns, last registered first. Only the methods those
// packages call are implemented; the embedded nil TB supplies the unexported method.
type runner struct {
	testing.TB
	log *slog.Logger

	mu       sync.Mutex
	cleanups []func()
	errs     []string
}

var _ testing.TB = (*runner)(nil)

// fatalRun is the panic value of runner.Fatal.
type fatalRun struct{ msg string }

func newRunner(log *slog.Logger) *runner { return &runner{log: log} }

func (r *runner) Helper()      {}
func (r *runner) Name() string { return "ipledger-bench" }

func (r *runner) Cleanup(f func()) {
	r.mu.Lock()
	r.cleanups = append(r.cleanups, f)
	r.mu.Unlock()
}

func (r *runner) Log(args ...any)                 { r.log.Info(strings.TrimSpace(fmt.Sprintln(args...))) }
func (r *runner) Logf(format string, args ...any) { r.log.Info(fmt.Sprintf(format, args...)) }

func (r *runner) Error(args ...any) { r.record(strings.TrimSpace(fmt.Sprintln(args...))) }
func (r *runner) Errorf(format string, args ...any) {
	r.record(fmt.Sprintf(format, args...))
}

func (r *runner) record(msg string) {
	r.log.Error(msg)
	r.mu.Lock()
	r.errs = append(r.errs, msg)
	r.mu.Unlock()
}

func (r *runner) Fail() { r.record("failed") }
func (r *runner) FailNow() {
	r.record("failed")
	panic(fatalRun{"failed"})
}

func (r *runner) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.errs) > 0
}

func (r *runner) Fatal(args ...any) {
	msg := strings.TrimSpace(fmt.Sprintln(args...))
	r.record(msg)
	panic(fatalRun{msg})
}

func (r *runner) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.record(msg)
	panic(fatalRun{msg})
}

func (r *runner) TempDir() string {
	d, err := os.MkdirTemp("", "ipledger-bench-")
	if err != nil {
		r.Fatal(err)
	}
	r.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// cleanup runs the registered functions, last first; a Fatal inside one is recorded
// and the rest still run.
func (r *runner) cleanup() {
	for {
		r.mu.Lock()
		n := len(r.cleanups)
		if n == 0 {
			r.mu.Unlock()
			return
		}
		f := r.cleanups[n-1]
		r.cleanups = r.cleanups[:n-1]
		r.mu.Unlock()
		func() {
			defer func() {
				if p := recover(); p != nil {
					if _, ok := p.(fatalRun); !ok {
						r.record(fmt.Sprint("cleanup panicked: ", p))
					}
				}
			}()
			f()
		}()
	}
}

// err joins the recorded errors.
func (r *runner) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errs) == 0 {
		return nil
	}
	return errors.New(strings.Join(r.errs, "; "))
}
