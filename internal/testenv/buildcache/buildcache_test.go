package buildcache

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// hello is a recipe building a one-file program that prints greeting, with a
// counter of the builds it ran.
func hello(dir, greeting string, builds *atomic.Int32) Recipe {
	return Recipe{
		Name: "hello", Version: "v0.0.1", Dir: dir,
		Key:     []string{"hello", greeting, Toolchain()},
		Outputs: []string{"hello"},
		Cold:    2 * time.Second,
		Build: func(src, out string) error {
			builds.Add(1)
			if err := WriteModule(src, ModFile("hello", "")); err != nil {
				return err
			}
			prog := fmt.Sprintf("package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Print(%q) }\n", greeting)
			if err := os.MkdirAll(filepath.Join(src, "cmd", "hello"), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(src, "cmd", "hello", "main.go"), []byte(prog), 0o644); err != nil {
				return err
			}
			_, err := Go(src, nil, "build", "-trimpath", "-o", filepath.Join(out, "hello"), "./cmd/hello")
			return err
		},
	}
}

func run(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command(path).Output()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return string(out)
}

// TestEnsureBuildsOnceAndStamps: a cold Ensure builds, stamps and says what it
// builds; a warm one builds nothing; a changed key builds again.
func TestEnsureBuildsOnceAndStamps(t *testing.T) {
	dir := t.TempDir()
	var builds atomic.Int32
	var lines []string
	logf := func(f string, a ...any) { lines = append(lines, fmt.Sprintf(f, a...)) }
	r := hello(dir, "hi", &builds)
	bin, err := Ensure(r, logf)
	if err != nil {
		t.Fatal(err)
	}
	if got := run(t, filepath.Join(bin, "hello")); got != "hi" {
		t.Fatalf("hello printed %q", got)
	}
	stamp, _ := os.ReadFile(filepath.Join(bin, ".stamp"))
	if strings.TrimSpace(string(stamp)) != r.Stamp() {
		t.Fatalf("stamp %q, want %q", stamp, r.Stamp())
	}
	if len(lines) == 0 || !strings.Contains(lines[0], "building hello v0.0.1 (cold, about 2s on 2 cores)") {
		t.Fatalf("first progress line %q", lines)
	}
	if _, err := os.Stat(filepath.Join(dir, "bin.tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("bin.tmp left behind: %v", err)
	}
	lines = nil
	if _, err := Ensure(r, logf); err != nil {
		t.Fatal(err)
	}
	if builds.Load() != 1 || len(lines) != 0 {
		t.Fatalf("warm Ensure: %d builds, lines %q", builds.Load(), lines)
	}
	r2 := hello(dir, "hello again", &builds)
	if r2.Stamp() == r.Stamp() {
		t.Fatal("another key, the same stamp")
	}
	if _, err := Ensure(r2, logf); err != nil {
		t.Fatal(err)
	}
	if got := run(t, filepath.Join(bin, "hello")); builds.Load() != 2 || got != "hello again" {
		t.Fatalf("after a key change: %d builds, hello printed %q", builds.Load(), got)
	}
}

// TestFailedBuildLeavesNoStamp: a build that fails, or returns without
// writing its outputs, leaves no stamp and no bin.tmp; the previous bin stays
// as it was, and the next Ensure builds again.
func TestFailedBuildLeavesNoStamp(t *testing.T) {
	dir := t.TempDir()
	var builds atomic.Int32
	good := hello(dir, "v1", &builds)
	if _, err := Ensure(good, nil); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(dir, "bin", ".stamp"))

	broken := hello(dir, "v2", &builds)
	inner := broken.Build
	broken.Build = func(src, out string) error {
		if err := inner(src, out); err != nil {
			return err
		}
		// Half a build: an output written, then the compiler fails.
		if err := os.WriteFile(filepath.Join(src, "cmd", "hello", "main.go"), []byte("package main\nfunc main() {"), 0o644); err != nil {
			return err
		}
		_, err := Go(src, nil, "build", "-o", filepath.Join(out, "hello"), "./cmd/hello")
		return err
	}
	if _, err := Ensure(broken, nil); err == nil || !strings.Contains(err.Error(), "go build") {
		t.Fatalf("broken build: err %v", err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "bin", ".stamp")); string(after) != string(before) {
		t.Fatalf("a failed build changed the stamp: %q -> %q", before, after)
	}
	if broken.Cached() {
		t.Fatal("the failed recipe validates")
	}
	if _, err := os.Stat(filepath.Join(dir, "bin.tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("bin.tmp left behind: %v", err)
	}

	empty := hello(dir, "v3", &builds)
	empty.Build = func(src, out string) error { return nil }
	if _, err := Ensure(empty, nil); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("a build writing no output: err %v, want ErrIncomplete", err)
	}
	if empty.Cached() {
		t.Fatal("a build writing no output validates")
	}

	n := builds.Load()
	if _, err := Ensure(hello(dir, "v2", &builds), nil); err != nil {
		t.Fatal(err)
	}
	if got := run(t, filepath.Join(dir, "bin", "hello")); builds.Load() != n+1 || got != "v2" {
		t.Fatalf("after the failure: %d builds, hello printed %q", builds.Load()-n, got)
	}
}

// TestEnsureWaitsForTheLockAndLooksAgain: while another holder has the build
// lock, Ensure waits (seen in /proc/locks as a blocked flock on the lock
// file); when the holder has built the recipe meanwhile, Ensure takes its
// result and builds nothing.
func TestEnsureWaitsForTheLockAndLooksAgain(t *testing.T) {
	dir := t.TempDir()
	lockFile := filepath.Join(t.TempDir(), "shared.lock")
	var builds atomic.Int32
	r := hello(dir, "locked", &builds)
	r.LockFile = lockFile

	// The other holder: the lock, then (while Ensure waits) the recipe's
	// build as its own process would run it.
	unlock, err := lock(lockFile)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var got string
	var gotErr error
	wg.Go(func() { got, gotErr = Ensure(r, nil) })
	waitBlockedFlock(t, lockFile)
	if err := build(r); err != nil {
		unlock()
		wg.Wait()
		t.Fatal(err)
	}
	unlock()
	wg.Wait()
	if gotErr != nil {
		t.Fatal(gotErr)
	}
	if builds.Load() != 1 || got != r.BinDir() {
		t.Fatalf("Ensure after waiting: %d builds (want 1: the holder's), dir %q", builds.Load(), got)
	}
}

// waitBlockedFlock waits until /proc/locks lists a process blocked on a
// FLOCK of path's inode (a "->" line).
func waitBlockedFlock(t *testing.T, path string) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	// /proc/locks names the file as MAJOR:MINOR:INODE, the device in hex.
	dev := fmt.Sprintf(":%d ", st.Ino)
	for i := 0; ; i++ {
		b, err := os.ReadFile("/proc/locks")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "->") && strings.Contains(l, "FLOCK") && strings.Contains(l+" ", dev) {
				return
			}
		}
		if i > 6000 {
			t.Fatalf("no blocked flock on %s in /proc/locks:\n%s", path, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRecipeWithoutFieldsIsRefused: a recipe missing what Ensure needs is an
// error naming the field, before any lock or directory.
func TestRecipeWithoutFieldsIsRefused(t *testing.T) {
	dir := t.TempDir()
	var builds atomic.Int32
	for _, tc := range []struct {
		field string
		strip func(*Recipe)
	}{
		{"Dir", func(r *Recipe) { r.Dir = "" }},
		{"Key", func(r *Recipe) { r.Key = nil }},
		{"Outputs", func(r *Recipe) { r.Outputs = nil }},
		{"Build", func(r *Recipe) { r.Build = nil }},
	} {
		r := hello(filepath.Join(dir, tc.field), "x", &builds)
		tc.strip(&r)
		_, err := Ensure(r, nil)
		if !errors.Is(err, ErrRecipe) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("recipe without %s: err %v", tc.field, err)
		}
	}
	if builds.Load() != 0 {
		t.Fatalf("%d builds of incomplete recipes", builds.Load())
	}
}

// TestProgressWhileBuilding: a build longer than the tick says it still runs.
func TestProgressWhileBuilding(t *testing.T) {
	old := tickEvery
	tickEvery = 5 * time.Millisecond
	defer func() { tickEvery = old }()
	var mu sync.Mutex
	var lines []string
	logf := func(f string, a ...any) { mu.Lock(); lines = append(lines, fmt.Sprintf(f, a...)); mu.Unlock() }
	var builds atomic.Int32
	r := hello(t.TempDir(), "slow", &builds)
	inner := r.Build
	seen := make(chan struct{})
	r.Build = func(src, out string) error {
		<-seen // returns once a "still building" line was said
		return inner(src, out)
	}
	said := logf
	logf = func(f string, a ...any) {
		said(f, a...)
		if strings.Contains(f, "still building") {
			select {
			case <-seen:
			default:
				close(seen)
			}
		}
	}
	if _, err := Ensure(r, logf); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(strings.Join(lines, "\n"), "still building hello v0.0.1") {
		t.Fatalf("no progress line: %q", lines)
	}
}
