package boltstore_test

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/boltstore"
)

func open(t testing.TB, path string) *boltstore.Store {
	t.Helper()
	st, err := boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestLedgerSuite(t *testing.T) {
	ledgertest.Run(t, func(t *testing.T) (ledger.Store, func() ledger.Store) {
		path := filepath.Join(t.TempDir(), "ledger.db")
		st := open(t, path)
		cur := st
		t.Cleanup(func() { cur.Close() })
		return st, func() ledger.Store {
			cur.Close()
			cur = open(t, path)
			return cur
		}
	})
}

func TestCorruptFile(t *testing.T) {
	dir := t.TempDir()
	cases := map[string][]byte{
		"garbage":   []byte(strings.Repeat("not a ledger ", 2000)),
		"truncated": nil, // filled below from a real file
	}
	real := filepath.Join(dir, "real.db")
	st := open(t, real)
	l := ledgertest.Open(t, st, ledger.Options{})
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key("a"), Ranges: ledgertest.Ranges(t, `[[{"subnet":"10.0.0.0/24"}]]`)}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(real)
	if err != nil {
		t.Fatal(err)
	}
	cases["truncated"] = b[:100]
	cases["empty"] = []byte{}
	cases["foreign bbolt"] = boltFile(t, filepath.Join(dir, "foreign.src"), "other", nil)
	cases["other schema"] = boltFile(t, filepath.Join(dir, "schema.src"), "meta", map[string]string{"schema": "99"})
	for name, content := range cases {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, name+".db")
			if err := os.WriteFile(p, content, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := boltstore.Open(p)
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

func TestLockedByAnotherAgent(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ledger.db")
	st := open(t, p)
	defer st.Close()
	_, err := boltstore.Open(p)
	if err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("err = %v, want a clear 'locked' error", err)
	}
}

// A full disk fails the operation cleanly and loses nothing already committed: the
// state file lives on a tiny tmpfs that the test fills up.
func TestDiskFull(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs (the test needs root): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	p := filepath.Join(dir, "ledger.db")
	st := open(t, p)
	l, err := ledger.Open(st, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := ledgertest.Ranges(t, `[[{"subnet":"10.0.0.0/16"}]]`)
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
	ledgertest.Audit(t, l)
	// further operations keep failing cleanly or succeed; never half-done
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key("more"), Ranges: r}); err == nil {
		acked[ledgertest.Key("more")] = "?"
	}
	l.Close()
	l2 := ledgertest.Open(t, open(t, p), ledger.Options{})
	for k, ip := range acked {
		ls, ok := l2.Lease(k)
		if !ok || (ip != "?" && ls.IPs[0].String() != ip) {
			t.Fatalf("acknowledged lease %s (%s) lost after disk full: %v %v", k, ip, ls, ok)
		}
	}
}

// The crash test: a child process allocates and releases in a loop, printing an
// acknowledgement after each success; the test SIGKILLs it at random moments, reopens
// the ledger and checks that every acknowledged change is there and the books balance.
func TestCrashConsistency(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ledger.db")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]string{} // container ID -> IP, acknowledged and not released
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	const kills = 60
	acks, midOp := 0, 0 // acknowledged operations; kills that landed inside one
	for run := 0; run < kills; run++ {
		cmd := exec.Command(exe, "-test.run=^TestCrashChild$")
		cmd.Env = append(os.Environ(), "IPLEDGER_CRASH_CHILD="+p, fmt.Sprintf("IPLEDGER_CRASH_RUN=%d", run))
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
		read := make(chan struct{})
		go func() {
			defer close(read)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines = append(lines, sc.Text())
			}
		}()
		time.Sleep(time.Duration(20+rng.IntN(120)) * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-read
		pending := "" // the one operation begun but not acknowledged
		for _, line := range lines {
			f := strings.Fields(line)
			switch {
			case len(f) == 2 && f[0] == "BEGIN":
				pending = f[1]
				continue
			case len(f) == 3 && f[0] == "ALLOC":
				live[f[1]] = f[2]
			case len(f) == 2 && f[0] == "REL":
				delete(live, f[1])
			case len(f) >= 1 && f[0] == "ERR":
				t.Fatalf("child: %s", line)
			}
			acks++
			pending = ""
		}
		if pending != "" {
			midOp++
		}
		cmd.Wait()
		st, err := boltstore.Open(p)
		if err != nil {
			t.Fatalf("after kill %d: reopen: %v", run, err)
		}
		l, err := ledger.Open(st, ledger.Options{})
		if err != nil {
			t.Fatalf("after kill %d: open ledger: %v", run, err)
		}
		rep := ledgertest.Audit(t, l)
		for cid, ip := range live {
			ls, ok := l.Lease(ledgertest.Key(cid))
			if cid == pending && !ok {
				continue // its release was begun and may have landed
			}
			if !ok || ls.IPs[0].String() != ip {
				t.Fatalf("after kill %d: acknowledged lease %s=%s is missing (got %v)", run, cid, ip, ls.IPs)
			}
		}
		for _, ls := range l.Leases("") {
			if _, ok := live[ls.Key.ContainerID]; !ok && ls.Key.ContainerID != pending {
				t.Fatalf("after kill %d: lease %s exists but was never begun or was acknowledged released", run, ls.Key)
			}
		}
		if rep.Live == 0 && len(live) > 1 {
			t.Fatalf("after kill %d: ledger empty", run)
		}
		live = map[string]string{}
		// resync with what really is there (an unacknowledged commit may have landed)
		for _, ls := range l.Leases("") {
			live[ls.Key.ContainerID] = ls.IPs[0].String()
		}
		l.Close()
	}
	t.Logf("%d kills (%d inside an operation), %d acknowledged operations, %d live leases at the end", kills, midOp, acks, len(live))
	// The test proves something only if the child worked and was killed mid-change.
	if acks < kills || midOp < kills/4 {
		t.Fatalf("%d acknowledged operations and %d kills inside one over %d kills: the child did not run its loop", acks, midOp, kills)
	}
}

// TestCrashChild is the child of TestCrashConsistency; it does nothing when run alone.
func TestCrashChild(t *testing.T) {
	p := os.Getenv("IPLEDGER_CRASH_CHILD")
	if p == "" {
		return
	}
	run := os.Getenv("IPLEDGER_CRASH_RUN")
	st, err := boltstore.Open(p)
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	l, err := ledger.Open(st, ledger.Options{})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	r, _ := poolRanges()
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

// boltFile writes a bbolt file with one bucket holding kv and returns its bytes.
func boltFile(t *testing.T, path, bucket string, kv map[string]string) []byte {
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
