// Package storetest holds the tests that every file-backed ledger.Store (boltstore,
// walstore) must pass in the same way: crash consistency under SIGKILL, refusal of
// corrupt files, the lock against a second agent, and the shared benchmark fill. Each
// store's test file calls these with its own Opener, so both stores show the same
// test names and assertions.
package storetest

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/testenv"
)

// Opener opens the store kept at path (the state file; a store may keep more files
// beside it).
type Opener func(path string) (ledger.Store, error)

// The environment of a crash child: the state file, the run number, and (optionally)
// the named step at which the child kills itself the after-th time it reaches it.
const (
	envChild = "IPLEDGER_CRASH_CHILD"
	envRun   = "IPLEDGER_CRASH_RUN"
	envStep  = "IPLEDGER_CRASH_STEP"
	envAfter = "IPLEDGER_CRASH_AFTER"
	// envStartDelay (milliseconds) holds the child back before it opens the
	// store: a start as slow as a loaded machine's.
	envStartDelay = "IPLEDGER_CRASH_START_DELAY_MS"
)

// CrashRun is what one killed child left: its acknowledged operations, and the one
// operation begun and not acknowledged ("" when the kill fell between operations).
type CrashRun struct {
	Acks    int
	Pending string
	MidOp   bool
}

// RunCrashChild starts the test binary's TestCrashChild on p and records its
// acknowledged changes into live (container ID -> IP). With step set, the child kills
// itself (SIGKILL) the after-th time it reaches step; else this kills it after a
// random pause (20 to 140 ms) counted from its first BEGIN, when its loop runs: a
// machine's load slows the child's start, not where the kill lands. The child must
// end by SIGKILL.
func RunCrashChild(t *testing.T, p string, run int, step string, after int, rng *rand.Rand, live map[string]string) CrashRun {
	t.Helper()
	return runCrashChild(t, p, run, step, after, rng, live, 0)
}

func runCrashChild(t *testing.T, p string, run int, step string, after int, rng *rand.Rand, live map[string]string, startDelay time.Duration) CrashRun {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestCrashChild$")
	cmd.Env = append(os.Environ(), envChild+"="+p, fmt.Sprintf("%s=%d", envRun, run),
		envStep+"="+step, fmt.Sprintf("%s=%d", envAfter, after), fmt.Sprintf("%s=%d", envStartDelay, startDelay.Milliseconds()))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Read everything as it comes, so that the child never blocks on a full pipe
	// (it would then be killed while waiting, not in the middle of a commit).
	var lines []string
	read, begun := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(out)
		sawBegin := false
		for sc.Scan() {
			if !sawBegin && strings.HasPrefix(sc.Text(), "BEGIN") {
				sawBegin = true
				close(begun)
			}
			lines = append(lines, sc.Text())
		}
	}()
	exited := make(chan struct{})
	go func() {
		wait := time.Duration(20+rng.IntN(120)) * time.Millisecond
		if step != "" {
			wait = 30 * time.Second // the child kills itself; this is a backstop
		} else {
			select {
			case <-read:
			case <-begun:
			}
		}
		select {
		case <-read:
		case <-time.After(wait):
		}
		cmd.Process.Signal(syscall.SIGKILL)
		close(exited)
	}()
	<-read
	<-exited
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("run %d (step %q): child ended with %v, not by SIGKILL; it printed:\n%s", run, step, err, strings.Join(lines, "\n"))
	}
	var r CrashRun
	for _, line := range lines {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "BEGIN":
			r.Pending = f[1]
			continue
		case len(f) == 3 && f[0] == "ALLOC":
			live[f[1]] = f[2]
		case len(f) == 2 && f[0] == "REL":
			delete(live, f[1])
		case len(f) >= 1 && f[0] == "ERR":
			t.Fatalf("child: %s", line)
		}
		r.Acks++
		r.Pending = ""
	}
	r.MidOp = r.Pending != ""
	return r
}

// CheckAfterCrash reopens p and checks that every acknowledged change is there, that
// nothing never begun is, and that the books balance; it returns what is live.
func CheckAfterCrash(t *testing.T, open Opener, p string, what string, live map[string]string, pending string) map[string]string {
	t.Helper()
	st, err := open(p)
	if err != nil {
		t.Fatalf("after %s: reopen: %v", what, err)
	}
	l, err := ledger.Open(st, ledger.Options{})
	if err != nil {
		t.Fatalf("after %s: open ledger: %v", what, err)
	}
	defer l.Close()
	rep := ledgertest.Audit(t, l)
	for cid, ip := range live {
		ls, ok := l.Lease(ledgertest.Key(cid))
		if cid == pending && !ok {
			continue // its release was begun and may have landed
		}
		if !ok || ls.IPs[0].String() != ip {
			t.Fatalf("after %s: acknowledged lease %s=%s is missing (got %v)", what, cid, ip, ls.IPs)
		}
	}
	now := map[string]string{}
	for _, ls := range l.Leases("") {
		if _, ok := live[ls.Key.ContainerID]; !ok && ls.Key.ContainerID != pending {
			t.Fatalf("after %s: lease %s exists but was never begun or was acknowledged released", what, ls.Key)
		}
		// resync with what really is there (an unacknowledged commit may have landed)
		now[ls.Key.ContainerID] = ls.IPs[0].String()
	}
	if rep.Live == 0 && len(live) > 1 {
		t.Fatalf("after %s: ledger empty", what)
	}
	return now
}

// CrashConsistency is the crash test: a child allocates and releases in a loop,
// printing an acknowledgement after each success; the test SIGKILLs it at random
// moments of its loop (60 times, 20 under -short), reopens the ledger and checks that
// every acknowledged change is there and the books balance, and that a quarter of
// the kills or more landed inside an operation. The test binary must have a
// TestCrashChild calling CrashChild.
func CrashConsistency(t *testing.T, open Opener) {
	t.Helper()
	crashConsistency(t, open, testenv.Size(60, 20), 0)
}

// CrashConsistencySlowStart is CrashConsistency with every child held back before
// it opens the store for longer than the longest pause before a kill, as a loaded
// machine holds it back: the kills still land in the loop, a quarter or more of
// them inside an operation.
func CrashConsistencySlowStart(t *testing.T, open Opener) {
	t.Helper()
	crashConsistency(t, open, 12, 200*time.Millisecond)
}

func crashConsistency(t *testing.T, open Opener, kills int, startDelay time.Duration) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ledger.db")
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	live := map[string]string{} // container ID -> IP, acknowledged and not released
	acks, midOp := 0, 0         // acknowledged operations; kills that landed inside one
	for run := range kills {
		r := runCrashChild(t, p, run, "", 0, rng, live, startDelay)
		acks += r.Acks
		if r.MidOp {
			midOp++
		}
		live = CheckAfterCrash(t, open, p, fmt.Sprintf("kill %d", run), live, r.Pending)
	}
	t.Logf("%d kills (%d inside an operation), %d acknowledged operations, %d live leases at the end", kills, midOp, acks, len(live))
	// The test proves something only if the child worked and was killed mid-change.
	if acks < kills || midOp < kills/4 {
		t.Fatalf("%d acknowledged operations and %d kills inside one over %d kills: the child did not run its loop", acks, midOp, kills)
	}
}

// CrashStep is the step (and how many times to pass it) at which a crash child must
// kill itself; "" when none was asked or this is not a crash child.
func CrashStep() (step string, after int) {
	if os.Getenv(envChild) == "" {
		return "", 0
	}
	after, _ = strconv.Atoi(os.Getenv(envAfter))
	return os.Getenv(envStep), after
}

// CrashChild is the body of a store's TestCrashChild: run by RunCrashChild, it opens
// the store and allocates and releases forever, printing BEGIN before and ALLOC or
// REL after each durable change (ERR and exit 1 on a failure). Run alone (not as a
// crash child) it returns at once.
func CrashChild(t *testing.T, open Opener) {
	p := os.Getenv(envChild)
	if p == "" {
		return
	}
	run := os.Getenv(envRun)
	if ms, _ := strconv.Atoi(os.Getenv(envStartDelay)); ms > 0 {
		time.Sleep(time.Duration(ms) * time.Millisecond)
	}
	st, err := open(p)
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	l, err := ledger.Open(st, ledger.Options{})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	r := ledgertest.Ranges(t, `[[{"subnet":"10.20.0.0/16"}]]`)
	w := bufio.NewWriter(os.Stdout)
	held := []string{}
	for _, ls := range l.Leases("") {
		held = append(held, ls.Key.ContainerID)
	}
	for i := 0; ; i++ {
		if len(held) > 0 && i%3 == 2 {
			cid := held[0]
			held = held[1:]
			fmt.Fprintln(w, "BEGIN", cid)
			w.Flush()
			if _, _, err := l.Release(ledgertest.Key(cid), ledger.ReasonDEL, ""); err != nil {
				fmt.Fprintln(w, "ERR", err)
				w.Flush()
				os.Exit(1)
			}
			fmt.Fprintln(w, "REL", cid)
		} else {
			cid := fmt.Sprintf("r%s-%d", run, i)
			fmt.Fprintln(w, "BEGIN", cid)
			w.Flush()
			ls, _, err := l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key(cid), Ranges: r})
			if err != nil {
				fmt.Fprintln(w, "ERR", err)
				w.Flush()
				os.Exit(1)
			}
			held = append(held, cid)
			fmt.Fprintln(w, "ALLOC", cid, ls.IPs[0])
		}
		w.Flush()
	}
}

// CorruptFile: a garbage, empty, truncated, foreign-bbolt or other-schema state file
// is refused with ErrCorrupt naming the file and the fix ("move the file aside"; for
// the other schema, the version found), and opening it changes nothing. With
// emptyHasRules the empty file is left out: the store decides on more evidence (its
// log) and tests that itself.
func CorruptFile(t *testing.T, open Opener, emptyHasRules bool) {
	t.Helper()
	dir := t.TempDir()
	cases := map[string][]byte{
		"garbage": []byte(strings.Repeat("not a ledger ", 2000)),
	}
	if !emptyHasRules {
		cases["empty"] = []byte{}
	}
	real := filepath.Join(dir, "real.db")
	st, err := open(real)
	if err != nil {
		t.Fatal(err)
	}
	l := ledgertest.Open(t, st, ledger.Options{})
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key("a"), Ranges: ledgertest.Ranges(t, `[[{"subnet":"10.0.0.0/24"}]]`)}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(real)
	if err != nil {
		t.Fatal(err)
	}
	cases["truncated"] = b[:100]
	cases["foreign bbolt"] = BoltFile(t, filepath.Join(dir, "foreign.src"), "other", nil)
	cases["other schema"] = BoltFile(t, filepath.Join(dir, "schema.src"), "meta", map[string]string{"schema": "99"})
	for name, content := range cases {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, name+".db")
			if err := os.WriteFile(p, content, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := open(p)
			if !errors.Is(err, ledger.ErrCorrupt) || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "move the file aside") ||
				(name == "other schema" && !strings.Contains(err.Error(), `schema version "99"`)) {
				t.Fatalf("err = %v, want ErrCorrupt naming %s and the fix", err, p)
			}
			after, _ := os.ReadFile(p)
			if string(after) != string(content) {
				t.Fatal("opening a corrupt file changed it")
			}
		})
	}
}

// LockedByAnotherAgent: a second open of a state file that is open fails with a clear
// "locked by another process" error.
func LockedByAnotherAgent(t *testing.T, open Opener) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ledger.db")
	st, err := open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	_, err = open(p)
	if err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("err = %v, want a clear 'locked' error", err)
	}
}

// BoltFile writes a bbolt file with one bucket holding kv and returns its bytes.
func BoltFile(t *testing.T, path, bucket string, kv map[string]string) []byte {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte(bucket))
		if err != nil {
			return err
		}
		for k, v := range kv {
			if err := b.Put([]byte(k), []byte(v)); err != nil {
				return err
			}
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Tmpfs mounts a tmpfs of size on a new directory, unmounted in t.Cleanup (the tests
// that fill a disk or reopen a store thousands of times need one; they need root).
func Tmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs (the test needs root): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

// FillDisk allocates in r (one lease after another, with long container IDs) until an
// allocation fails, which must be within 20000 allocations and an ErrStore naming p
// (the state file on a full disk). It returns the acknowledged leases (key -> IP) and
// the failure.
func FillDisk(t *testing.T, l *ledger.Ledger, p string, r []pool.RangeSet) (map[ledger.Key]string, error) {
	t.Helper()
	acked := map[ledger.Key]string{}
	var fullErr error
	for i := 0; i < 20000 && fullErr == nil; i++ {
		k := ledgertest.Key(fmt.Sprintf("c%05d-%s", i, strings.Repeat("x", 200)))
		ls, _, err := l.Allocate(ledger.AllocateRequest{Key: k, Ranges: r})
		if err != nil {
			fullErr = err
			break
		}
		acked[k] = ls.IPs[0].String()
	}
	if fullErr == nil {
		t.Fatal("the disk never filled up")
	}
	if !errors.Is(fullErr, ledger.ErrStore) || !strings.Contains(fullErr.Error(), p) {
		t.Fatalf("err = %v, want ErrStore naming %s", fullErr, p)
	}
	t.Logf("disk full after %d allocations: %v", len(acked), fullErr)
	return acked, fullErr
}
