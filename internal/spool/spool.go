// Package spool keeps DELs that could not reach the agent. The plugin writes one
// small file per attachment (fsync'd, then renamed into place, then the directory
// fsync'd) and answers success; the agent applies the spool when it starts and
// periodically after, removing each entry only once its release is durable.
package spool

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
)

// Bounds on the spool: a full spool refuses new entries (the DEL then fails and the
// runtime retries it) rather than growing without limit.
const (
	MaxEntries   = 16384
	MaxEntrySize = 4096
)

// ErrFull: the spool holds MaxEntries entries already.
var ErrFull = errors.New("DEL spool full")

// Entry is one spooled DEL.
type Entry struct {
	Version   int        `json:"version"`
	Key       ledger.Key `json:"key"`
	Spooled   time.Time  `json:"spooled"`
	CNIVerb   string     `json:"verb"`
	PodUID    string     `json:"podUID,omitempty"`
	SpooledBy string     `json:"spooledBy,omitempty"`
}

const suffix = ".del"

// fileName names an attachment's entry. The name only deduplicates repeated DELs of
// one attachment (the key itself is inside the entry), so a 128-bit FNV-1a is enough;
// a cryptographic hash would pull Go's crypto initialisation into the plugin, which is
// exec'd on every pod start.
func fileName(k ledger.Key) string {
	h := fnv.New128a()
	h.Write([]byte(k.Network + "\x00" + k.ContainerID + "\x00" + k.IfName))
	return hex.EncodeToString(h.Sum(nil)) + suffix
}

// Write stores e durably in dir. Writing the same attachment twice keeps one entry.
func Write(dir string, e Entry) error {
	if err := e.Key.Validate(); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("DEL spool %s: %w", dir, err)
	}
	name := filepath.Join(dir, fileName(e.Key))
	if _, err := os.Stat(name); err != nil {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("DEL spool %s: %w", dir, err)
		}
		if len(ents) >= MaxEntries {
			return fmt.Errorf("%w: %s holds %d entries; start ipledgerd to apply them", ErrFull, dir, len(ents))
		}
	}
	e.Version = 1
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("DEL spool %s: %w", dir, err)
	}
	tmp := f.Name()
	_, werr := f.Write(b)
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, name)
	}
	if werr != nil {
		os.Remove(tmp)
		return fmt.Errorf("DEL spool %s: %w", dir, werr)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("DEL spool %s: fsync: %w", dir, err)
	}
	return nil
}

// Apply calls release for every entry of dir, oldest first, and removes each entry
// whose release returned nil. An entry that cannot be read or is not valid is moved to
// dir/rejected with a reason file, never silently dropped. It returns the number of
// entries applied.
func Apply(dir string, release func(Entry) error) (int, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("DEL spool %s: %w", dir, err)
	}
	type item struct {
		path string
		e    Entry
	}
	var items []item
	var errs []error
	for _, de := range ents {
		if de.IsDir() || !strings.HasSuffix(de.Name(), suffix) {
			continue
		}
		p := filepath.Join(dir, de.Name())
		e, err := read(p)
		if err != nil {
			errs = append(errs, reject(dir, p, err))
			continue
		}
		items = append(items, item{p, e})
	}
	sort.Slice(items, func(i, j int) bool { return items[i].e.Spooled.Before(items[j].e.Spooled) })
	n := 0
	for _, it := range items {
		if err := release(it.e); err != nil {
			errs = append(errs, fmt.Errorf("spooled DEL of %s: %w", it.e.Key, err))
			continue
		}
		if err := os.Remove(it.path); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	if n > 0 {
		if err := syncDir(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

func read(p string) (Entry, error) {
	var e Entry
	f, err := os.Open(p)
	if err != nil {
		return e, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxEntrySize+1))
	if err != nil {
		return e, err
	}
	if len(b) > MaxEntrySize {
		return e, fmt.Errorf("entry larger than %d bytes", MaxEntrySize)
	}
	if err := json.Unmarshal(b, &e); err != nil {
		return e, fmt.Errorf("not a spool entry: %v", err)
	}
	if e.Version != 1 {
		return e, fmt.Errorf("spool entry version %d, want 1", e.Version)
	}
	if err := e.Key.Validate(); err != nil {
		return e, err
	}
	if filepath.Base(p) != fileName(e.Key) {
		return e, fmt.Errorf("entry for %s stored under the wrong name", e.Key)
	}
	return e, nil
}

func reject(dir, p string, why error) error {
	rdir := filepath.Join(dir, "rejected")
	if err := os.MkdirAll(rdir, 0o700); err != nil {
		return err
	}
	dst := filepath.Join(rdir, filepath.Base(p))
	if err := os.Rename(p, dst); err != nil {
		return err
	}
	os.WriteFile(dst+".why", []byte(why.Error()+"\n"), 0o600)
	return fmt.Errorf("rejected spool entry %s (kept in %s): %w", filepath.Base(p), rdir, why)
}

// Len counts the entries waiting in dir.
func Len(dir string) int {
	ents, _ := os.ReadDir(dir)
	n := 0
	for _, de := range ents {
		if strings.HasSuffix(de.Name(), suffix) {
			n++
		}
	}
	return n
}
