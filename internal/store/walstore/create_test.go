package walstore

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/storetest"
)

// An empty ledger.db (what a kill during an older ipledgerd's first start left, between
// creating the file and bbolt's first write) whose log files hold no record has
// acknowledged nothing: Open starts a new ledger over it, saying so, and that ledger
// works and lasts. Whether the log files are missing or empty makes no difference.
func TestEmptyStateFileWithoutRecordsStartsFresh(t *testing.T) {
	for _, logs := range []string{"missing", "empty", "zeros"} {
		t.Run("log files "+logs, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "ledger.db")
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			for _, lp := range LogPaths(p) {
				switch logs {
				case "empty":
					os.WriteFile(lp, nil, 0o600)
				case "zeros": // grown by a chunk, never written
					os.WriteFile(lp, make([]byte, growChunk), 0o600)
				}
			}
			var logged bytes.Buffer
			st, err := Open(p, WithLogger(slog.New(slog.NewTextHandler(&logged, nil))))
			if err != nil {
				t.Fatalf("open over an empty state file whose log holds no record: %v", err)
			}
			if !strings.Contains(logged.String(), "state file was empty") || !strings.Contains(logged.String(), p) {
				t.Fatalf("open replaced the empty state file without saying so; it logged %q", logged.String())
			}
			l, err := ledger.Open(st, ledger.Options{})
			if err != nil {
				t.Fatal(err)
			}
			r := ledgertest.Ranges(t, `[[{"subnet":"10.0.0.0/24"}]]`)
			a, _, err := l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key("a"), Ranges: r})
			if err != nil {
				t.Fatal(err)
			}
			st.abandon() // as a crash leaves it: the lease is in the log only
			logged.Reset()
			st2, err := Open(p, WithLogger(slog.New(slog.NewTextHandler(&logged, nil))))
			if err != nil {
				t.Fatal(err)
			}
			l2 := ledgertest.Open(t, st2, ledger.Options{})
			if ls, ok := l2.Lease(ledgertest.Key("a")); !ok || ls.IPs[0] != a.IPs[0] {
				t.Fatalf("lease acknowledged after the fresh start: %v %v", ls, ok)
			}
			if logged.Len() != 0 {
				t.Fatalf("second open logged %q", logged.String())
			}
			if m, _ := filepath.Glob(filepath.Join(filepath.Dir(p), "*creating*")); len(m) != 0 {
				t.Fatalf("temporary files left: %v", m)
			}
		})
	}
}

// An empty ledger.db whose log holds a record is refused as before: that record was
// acknowledged, and ledger.db's log identity, which would say whose it is, is gone.
// Opening it changes nothing.
func TestEmptyStateFileWithRecordsRefused(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src", "ledger.db")
	st := open(t, src)
	l := ledgertest.Open(t, st, ledger.Options{})
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key("a"), Ranges: ledgertest.Ranges(t, `[[{"subnet":"10.0.0.0/24"}]]`)}); err != nil {
		t.Fatal(err)
	}
	wal, err := os.ReadFile(LogPaths(src)[st.active])
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		t.Run(fmt.Sprintf("record in wal.%d", i), func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "ledger.db")
			os.WriteFile(p, nil, 0o600)
			os.WriteFile(LogPaths(p)[i], wal, 0o600)
			_, err := Open(p)
			if !errors.Is(err, ledger.ErrCorrupt) || !strings.Contains(err.Error(), LogPaths(p)[i]) || !strings.Contains(err.Error(), "move the file aside") {
				t.Fatalf("err = %v, want ErrCorrupt naming %s and the fix", err, LogPaths(p)[i])
			}
			if fi, err := os.Stat(p); err != nil || fi.Size() != 0 {
				t.Fatalf("the refused state file was changed: %v %v", fi, err)
			}
			if b, _ := os.ReadFile(LogPaths(p)[i]); !bytes.Equal(b, wal) {
				t.Fatal("the refused log was changed")
			}
		})
	}
}

// A temporary file left by a start killed while creating ledger.db is removed by the
// next start, which creates ledger.db whole; an agent holding a state file is not
// disturbed by another one's start (the lock decides, as before).
func TestCreateLeavesNoTemporaryFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "ledger.db")
	left := filepath.Join(dir, "ledger.db.creating-12345")
	if err := os.WriteFile(left, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	st := open(t, p)
	defer st.Close()
	if m, _ := filepath.Glob(filepath.Join(dir, "*creating*")); len(m) != 0 {
		t.Fatalf("temporary files left: %v", m)
	}
	if _, err := Open(p); err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("second open: %v, want the lock error", err)
	}
}

// TestCrashInFirstStart kills the child during its very first start, at each step of
// creating ledger.db (the temporary file written; linked into place before the
// directory's fsync), in an empty directory and over an empty ledger.db that an older
// release's kill left: the next start opens an empty, balanced ledger, and an agent
// then runs (and is killed at a random moment) and restarts as usual.
func TestCrashInFirstStart(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, uint64(time.Now().UnixNano())))
	for _, step := range []string{"create-written", "create-linked"} {
		for _, before := range []string{"no state file", "an empty state file"} {
			t.Run(step+"/"+before, func(t *testing.T) {
				p := filepath.Join(t.TempDir(), "ledger.db")
				if before == "an empty state file" {
					if err := os.WriteFile(p, nil, 0o600); err != nil {
						t.Fatal(err)
					}
				}
				live := map[string]string{}
				r := storetest.RunCrashChild(t, p, 1, step, 1, rng, live)
				if r.Acks != 0 {
					t.Fatalf("the child answered %d operations before its start was done", r.Acks)
				}
				live = storetest.CheckAfterCrash(t, openCrash, p, "a kill at "+step, live, r.Pending)
				r = storetest.RunCrashChild(t, p, 2, "", 0, rng, live)
				live = storetest.CheckAfterCrash(t, openCrash, p, "a random kill after it", live, r.Pending)
				t.Logf("killed at %s over %s: reopened; then %d acknowledged operations, %d live", step, before, r.Acks, len(live))
			})
		}
	}
}
