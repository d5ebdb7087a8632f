package spool

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/clock/clocktest"
)

// spoolDir is a directory as the agent makes it: root-owned, mode 0700.
func spoolDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "spool")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestWriteTake(t *testing.T) {
	dir := spoolDir(t)
	d := Open(dir, clocktest.New().Mono)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	keys := []api.Key{{Network: "n", ContainerID: "b", IfName: "eth0"}, {Network: "n", ContainerID: "a", IfName: "eth0"}}
	for i, k := range keys {
		if err := Write(dir, Entry{Key: k, Spooled: t0.Add(time.Duration(i) * time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	// the same DEL twice is one entry
	if err := Write(dir, Entry{Key: keys[0], Spooled: t0}); err != nil {
		t.Fatal(err)
	}
	got, err := d.Pending()
	if err != nil || len(got) != 2 || got[0] != keys[1] || got[1] != keys[0] {
		t.Fatalf("pending = %v, %v; want %v sorted", got, err, keys)
	}
	// a release that fails keeps the entry
	applied, err := d.Take(keys[1], func(Entry) error { return errors.New("store down") })
	if applied || err == nil || !strings.Contains(err.Error(), "store down") || d.Len() != 2 {
		t.Fatalf("take with a failing release = %v, %v (%d left)", applied, err, d.Len())
	}
	var seen Entry
	applied, err = d.Take(keys[1], func(e Entry) error { seen = e; return nil })
	if !applied || err != nil || seen.Key != keys[1] || !seen.Spooled.Equal(t0.Add(time.Second)) || d.Len() != 1 {
		t.Fatalf("take = %v, %v, entry %+v (%d left)", applied, err, seen, d.Len())
	}
	// taken: a second take finds nothing
	applied, err = d.Take(keys[1], func(Entry) error { t.Fatal("applied twice"); return nil })
	if applied || err != nil {
		t.Fatalf("second take = %v, %v", applied, err)
	}
}

func TestWriteRefusesBadKeys(t *testing.T) {
	dir := spoolDir(t)
	for _, k := range []api.Key{{Network: "n", ContainerID: "../x", IfName: "eth0"}, {Network: "n", ContainerID: strings.Repeat("a", 5000), IfName: "eth0"}} {
		if err := Write(dir, Entry{Key: k}); !errors.Is(err, api.ErrInvalidAttachment) {
			t.Errorf("key %q: err = %v", k.ContainerID[:4], err)
		}
	}
	if Len(dir) != 0 {
		t.Fatal("bad key spooled")
	}
}

// Entries that are not what the plugin writes (content, owner, mode, file type) are
// moved aside with their reason, never applied and never silently dropped.
func TestPendingRejectsBadEntries(t *testing.T) {
	k := api.Key{Network: "n", ContainerID: "c", IfName: "eth0"}
	good := func(mut func(map[string]any)) []byte {
		m := map[string]any{"version": 1, "key": map[string]string{"network": k.Network, "containerID": k.ContainerID, "ifname": k.IfName}, "spooled": "2026-01-01T00:00:00Z", "verb": "DEL"}
		mut(m)
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	plain := good(func(map[string]any) {})
	write := func(data []byte, mode os.FileMode) func(t *testing.T, p string) {
		return func(t *testing.T, p string) {
			if err := os.WriteFile(p, data, mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, mode); err != nil { // past the umask
				t.Fatal(err)
			}
		}
	}
	for _, c := range []struct {
		name, file string
		make       func(t *testing.T, p string)
		why        string
	}{
		{"garbage", fileName(k), write([]byte("{garbage"), 0o600), "not a spool entry"},
		{"oversized", fileName(k), write(append(plain, []byte(strings.Repeat(" ", MaxEntrySize))...), 0o600), "larger than"},
		{"other version", fileName(k), write(good(func(m map[string]any) { m["version"] = 2 }), 0o600), "version 2"},
		{"wrong name", "0123.del", write(plain, 0o600), "wrong name"},
		{"hostile key", fileName(k), write(good(func(m map[string]any) {
			m["key"] = map[string]string{"network": "n", "containerID": "../../etc", "ifname": "eth0"}
		}), 0o600), "CNI_CONTAINERID"},
		{"group writable", fileName(k), write(plain, 0o620), "group or others may write"},
		{"others writable", fileName(k), write(plain, 0o602), "group or others may write"},
		{"not owned by root", fileName(k), func(t *testing.T, p string) {
			write(plain, 0o600)(t, p)
			if err := os.Chown(p, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}, "owned by uid 65534"},
		{"symlink", fileName(k), func(t *testing.T, p string) {
			target := filepath.Join(t.TempDir(), "elsewhere")
			write(plain, 0o600)(t, target)
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
		}, "symlink"},
		{"fifo", fileName(k), func(t *testing.T, p string) {
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := spoolDir(t)
			c.make(t, filepath.Join(dir, c.file))
			d := Open(dir, clocktest.New().Mono)
			keys, err := d.Pending()
			if len(keys) != 0 || !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("pending = %v, %v; want a rejection saying %q", keys, err, c.why)
			}
			kept := "0000000001-" + c.file // the first rejection in this spool
			why, rerr := os.ReadFile(filepath.Join(dir, "rejected", kept+".why"))
			if rerr != nil || !strings.Contains(string(why), c.why) {
				t.Fatalf("rejected entry's reason %q (%v), want %q", why, rerr, c.why)
			}
			if _, err := os.Lstat(filepath.Join(dir, "rejected", kept)); err != nil {
				t.Fatalf("rejected entry not kept: %v", err)
			}
			if Len(dir) != 0 {
				t.Fatal("bad entry left in the spool")
			}
			// Take of the attachment rejects the same way and applies nothing
			c.make(t, filepath.Join(dir, c.file))
			if c.file == fileName(k) {
				applied, err := d.Take(k, func(Entry) error { t.Fatal("applied a bad entry"); return nil })
				if applied || !errors.Is(err, ErrRejected) {
					t.Fatalf("take of a bad entry = %v, %v", applied, err)
				}
			}
		})
	}
}

// A full spool refuses a new attachment's DEL (the runtime then retries it) and
// still takes a repeated DEL of an attachment already spooled. Temporary files and
// rejected entries do not count against the limit.
func TestWriteFull(t *testing.T) {
	dir := spoolDir(t)
	in := api.Key{Network: "n", ContainerID: "in", IfName: "eth0"}
	if err := Write(dir, Entry{Key: in, Spooled: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf(".tmp-%d", i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "rejected"), 0o700); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < MaxEntries-1; i++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("fill%05d.del", i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := Write(dir, Entry{Key: api.Key{Network: "n", ContainerID: "last", IfName: "eth0"}, Spooled: time.Now()}); err != nil {
		t.Fatalf("the last free slot (temporary files must not count): %v", err)
	}
	err := Write(dir, Entry{Key: api.Key{Network: "n", ContainerID: "new", IfName: "eth0"}, Spooled: time.Now()})
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

// Temporary files left by a plugin that died are removed once this agent has seen
// them for StaleTemp, judged by its monotonic clock: a wall-clock step forward does
// not remove a file a plugin may be writing.
func TestStaleTempRemoved(t *testing.T) {
	dir := spoolDir(t)
	clk := clocktest.New()
	d := Open(dir, clk.Mono)
	tmp := filepath.Join(dir, ".tmp-123")
	if err := os.WriteFile(tmp, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	// an old mtime does not matter either: only how long this agent saw it
	old := time.Now().Add(-24 * time.Hour)
	os.Chtimes(tmp, old, old)
	exists := func() bool { _, err := os.Lstat(tmp); return err == nil }
	for _, step := range []func(){
		func() {},
		func() { clk.Step(2 * StaleTemp) },
		func() { clk.Advance(StaleTemp - time.Second) },
	} {
		step()
		if _, err := d.Pending(); err != nil {
			t.Fatal(err)
		}
		if !exists() {
			t.Fatal("a temporary file was removed before this agent had seen it for StaleTemp")
		}
	}
	clk.Advance(time.Second)
	if _, err := d.Pending(); err != nil {
		t.Fatal(err)
	}
	if exists() {
		t.Fatal("a temporary file seen for StaleTemp was not removed")
	}
}

func TestPublishResolve(t *testing.T) {
	base := t.TempDir()
	sock := filepath.Join(base, "s.sock")
	dir := filepath.Join(base, "state", "spool")
	if _, err := Resolve(sock); !errors.Is(err, ErrNoSpool) || !strings.Contains(err.Error(), sock) {
		t.Fatalf("resolve with nothing published: %v, want ErrNoSpool naming the socket", err)
	}
	if err := Publish(sock, dir); err != nil {
		t.Fatal(err)
	}
	got, err := Resolve(sock)
	if err != nil || got != dir {
		t.Fatalf("resolve = %q, %v; want %q", got, err, dir)
	}
	// publishing again (a restart, another state dir) replaces the pointer
	dir2 := filepath.Join(base, "state2", "spool")
	if err := Publish(sock, dir2); err != nil {
		t.Fatal(err)
	}
	if got, err := Resolve(sock); err != nil || got != dir2 {
		t.Fatalf("resolve after a second publish = %q, %v; want %q", got, err, dir2)
	}

	ptr := Pointer(sock)
	for _, c := range []struct {
		name string
		make func(t *testing.T)
		why  string
	}{
		{"not a symlink", func(t *testing.T) { must(t, os.WriteFile(ptr, []byte(dir), 0o600)) }, "not a symlink"},
		{"relative target", func(t *testing.T) { must(t, os.Symlink("state/spool", ptr)) }, "not an absolute path"},
		{"target missing", func(t *testing.T) { must(t, os.Symlink(filepath.Join(base, "nowhere"), ptr)) }, "no such file"},
		{"target a file", func(t *testing.T) {
			f := filepath.Join(base, "afile")
			must(t, os.WriteFile(f, nil, 0o600))
			must(t, os.Symlink(f, ptr))
		}, "not a directory"},
		{"target group writable", func(t *testing.T) {
			d := filepath.Join(base, "gw")
			must(t, os.MkdirAll(d, 0o700))
			must(t, os.Chmod(d, 0o770))
			must(t, os.Symlink(d, ptr))
		}, "group or others may write"},
		{"target not root's", func(t *testing.T) {
			d := filepath.Join(base, "nobody")
			must(t, os.MkdirAll(d, 0o700))
			must(t, os.Chown(d, 65534, 65534))
			must(t, os.Symlink(d, ptr))
		}, "owned by uid 65534"},
		{"pointer not root's", func(t *testing.T) {
			must(t, os.Symlink(dir, ptr))
			must(t, os.Lchown(ptr, 65534, 65534))
		}, "owned by uid 65534"},
	} {
		t.Run(c.name, func(t *testing.T) {
			os.Remove(ptr)
			c.make(t)
			_, err := Resolve(sock)
			if !errors.Is(err, ErrNoSpool) || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("resolve = %v; want ErrNoSpool saying %q", err, c.why)
			}
		})
	}
	// an agent refuses to publish a spool others may write
	gw := filepath.Join(base, "gw")
	if err := Publish(sock, gw); err == nil || !strings.Contains(err.Error(), "group or others may write") {
		t.Fatalf("publish of a group-writable spool: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// An entry is read by the agent of whatever release runs when the spool is applied, so
// its JSON is a contract: renaming a field of Entry or of its key fails this test.
func TestEntryFieldNames(t *testing.T) {
	e := Entry{Version: 1, Key: api.Key{Network: "n", ContainerID: "c", IfName: "eth0"}, Spooled: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		CNIVerb: "DEL", PodUID: "u", SpooledBy: "s"}
	const want = `{"version":1,"key":{"network":"n","containerID":"c","ifname":"eth0"},"spooled":"2026-01-01T00:00:00Z","verb":"DEL","podUID":"u","spooledBy":"s"}`
	if got, err := json.Marshal(e); err != nil || string(got) != want {
		t.Errorf("entry:\n got %s (%v)\nwant %s", got, err, want)
	}
}

// rejected/ keeps at most MaxRejected entries with their reasons: each rejection
// beyond it removes the oldest, counted by TakeDropped and named in its error, and
// the newest stay. An entry still in the spool is never touched.
func TestRejectedBounded(t *testing.T) {
	dir := spoolDir(t)
	d := Open(dir, clocktest.New().Mono)
	good := api.Key{Network: "n", ContainerID: "good", IfName: "eth0"}
	if err := Write(dir, Entry{Key: good, Spooled: time.Now()}); err != nil {
		t.Fatal(err)
	}
	const extra = 10
	var names []string // the bad entries, in the order they were rejected
	droppedMsgs := 0
	for i := range MaxRejected + extra {
		name := fileName(api.Key{Network: "n", ContainerID: fmt.Sprintf("bad%03d", i), IfName: "eth0"})
		if err := os.WriteFile(filepath.Join(dir, name), []byte("{garbage"), 0o600); err != nil {
			t.Fatal(err)
		}
		keys, err := d.Pending()
		if !errors.Is(err, ErrRejected) || len(keys) != 1 || keys[0] != good {
			t.Fatalf("rejection %d: pending = %v, %v; want the good entry and a rejection", i, keys, err)
		}
		if strings.Contains(err.Error(), "removed the 1 oldest rejected entries") {
			droppedMsgs++
		}
		names = append(names, name)
	}
	if n := d.TakeDropped(); n != extra {
		t.Fatalf("dropped %d rejected entries, want %d", n, extra)
	}
	if n := d.TakeDropped(); n != 0 {
		t.Fatalf("dropped %d on the second take, want 0", n)
	}
	if droppedMsgs != extra {
		t.Fatalf("%d rejections said they removed an old entry, want %d", droppedMsgs, extra)
	}
	ents, err := os.ReadDir(filepath.Join(dir, "rejected"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 2*MaxRejected {
		t.Fatalf("rejected/ holds %d files, want %d entries and their reasons", len(ents), MaxRejected)
	}
	for i, name := range names {
		kept := fmt.Sprintf("%010d-%s", i+1, name)
		_, err := os.Lstat(filepath.Join(dir, "rejected", kept))
		_, werr := os.Lstat(filepath.Join(dir, "rejected", kept+".why"))
		if i < extra && (err == nil || werr == nil) {
			t.Fatalf("rejected entry %d (of the oldest %d) kept: %v %v", i, extra, err, werr)
		}
		if i >= extra && (err != nil || werr != nil) {
			t.Fatalf("rejected entry %d (among the newest %d) removed: %v %v", i, MaxRejected, err, werr)
		}
	}
	if Len(dir) != 1 {
		t.Fatalf("%d entries in the spool, want the good one", Len(dir))
	}
	applied, err := d.Take(good, func(e Entry) error { return nil })
	if !applied || err != nil {
		t.Fatalf("take of the good entry = %v, %v", applied, err)
	}
}
