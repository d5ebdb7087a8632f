package spool

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
)

func TestWriteApply(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	keys := []ledger.Key{{Network: "n", ContainerID: "b", IfName: "eth0"}, {Network: "n", ContainerID: "a", IfName: "eth0"}}
	for i, k := range keys {
		if err := Write(dir, Entry{Key: k, Spooled: t0.Add(time.Duration(i) * time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	// the same DEL twice is one entry
	if err := Write(dir, Entry{Key: keys[0], Spooled: t0}); err != nil {
		t.Fatal(err)
	}
	if n := Len(dir); n != 2 {
		t.Fatalf("%d entries, want 2", n)
	}
	// a hostile file: not an entry
	if err := os.WriteFile(filepath.Join(dir, "0000.del"), []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	// first apply fails for one key: it stays
	var got []string
	n, err := Apply(dir, func(e Entry) error {
		got = append(got, e.Key.ContainerID)
		if e.Key.ContainerID == "a" {
			return errors.New("store down")
		}
		return nil
	})
	if n != 1 || err == nil || !strings.Contains(err.Error(), "store down") || !strings.Contains(err.Error(), "rejected spool entry 0000.del") {
		t.Fatalf("apply = %d, %v", n, err)
	}
	if strings.Join(got, ",") != "b,a" {
		t.Fatalf("applied in order %v, want oldest first", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "rejected", "0000.del.why")); err != nil {
		t.Fatal("rejected entry not kept with its reason")
	}
	n, err = Apply(dir, func(Entry) error { return nil })
	if n != 1 || err != nil || Len(dir) != 0 {
		t.Fatalf("second apply = %d, %v, %d left", n, err, Len(dir))
	}
}

func TestWriteRefusesBadKeys(t *testing.T) {
	dir := t.TempDir()
	for _, k := range []ledger.Key{{Network: "n", ContainerID: "../x", IfName: "eth0"}, {Network: "n", ContainerID: strings.Repeat("a", 5000), IfName: "eth0"}} {
		if err := Write(dir, Entry{Key: k}); !errors.Is(err, ledger.ErrInvalidAttachment) {
			t.Errorf("key %q: err = %v", k.ContainerID[:4], err)
		}
	}
	if Len(dir) != 0 {
		t.Fatal("bad key spooled")
	}
}
