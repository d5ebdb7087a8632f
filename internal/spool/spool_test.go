package spool

import (
	"encoding/json"
	"errors"
	"fmt"
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

// Entries that are not what the plugin writes are moved aside with their reason,
// never applied and never silently dropped.
func TestApplyRejectsBadEntries(t *testing.T) {
	k := ledger.Key{Network: "n", ContainerID: "c", IfName: "eth0"}
	good := func(mut func(map[string]any)) []byte {
		m := map[string]any{"version": 1, "key": map[string]string{"network": k.Network, "containerID": k.ContainerID, "ifname": k.IfName}, "spooled": "2026-01-01T00:00:00Z", "verb": "DEL"}
		mut(m)
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, c := range []struct {
		name, file string
		data       []byte
		why        string
	}{
		{"oversized", fileName(k), append(good(func(map[string]any) {}), []byte(strings.Repeat(" ", MaxEntrySize))...), "larger than"},
		{"other version", fileName(k), good(func(m map[string]any) { m["version"] = 2 }), "version 2"},
		{"wrong name", "0123.del", good(func(map[string]any) {}), "wrong name"},
		{"hostile key", fileName(k), good(func(m map[string]any) {
			m["key"] = map[string]string{"network": "n", "containerID": "../../etc", "ifname": "eth0"}
		}), "CNI_CONTAINERID"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, c.file), c.data, 0o600); err != nil {
				t.Fatal(err)
			}
			n, err := Apply(dir, func(e Entry) error {
				t.Errorf("applied a bad entry: %+v", e)
				return nil
			})
			if n != 0 || err == nil || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("apply = %d, %v; want an error saying %q", n, err, c.why)
			}
			why, rerr := os.ReadFile(filepath.Join(dir, "rejected", c.file+".why"))
			if rerr != nil || !strings.Contains(string(why), c.why) {
				t.Fatalf("rejected entry's reason %q (%v), want %q", why, rerr, c.why)
			}
			if Len(dir) != 0 {
				t.Fatal("bad entry left in the spool")
			}
		})
	}
}

// A full spool refuses a new attachment's DEL (the runtime then retries it) and
// still takes a repeated DEL of an attachment already spooled.
func TestWriteFull(t *testing.T) {
	dir := t.TempDir()
	in := ledger.Key{Network: "n", ContainerID: "in", IfName: "eth0"}
	if err := Write(dir, Entry{Key: in, Spooled: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < MaxEntries; i++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("fill%05d.del", i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	err := Write(dir, Entry{Key: ledger.Key{Network: "n", ContainerID: "new", IfName: "eth0"}, Spooled: time.Now()})
	if !errors.Is(err, ErrFull) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("write to a full spool: %v, want ErrFull naming %s", err, dir)
	}
	if err := Write(dir, Entry{Key: in, Spooled: time.Now()}); err != nil {
		t.Fatalf("repeated DEL of a spooled attachment: %v", err)
	}
	if n := Len(dir); n != MaxEntries {
		t.Fatalf("%d entries, want %d", n, MaxEntries)
	}
}
