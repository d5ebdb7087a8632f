// Package spool keeps DELs that could not reach the agent. The plugin writes one
// small file per attachment (fsync'd, then renamed into place, then the directory
// fsync'd) and answers success; the agent applies an attachment's entry before it
// handles an ADD of that attachment, and applies the rest when it starts and
// periodically after, removing each entry only once its release is durable.
//
// Where: the agent serving a socket publishes its spool directory next to the socket
// (Publish: a root-owned symlink SOCKET.spool); the plugin spools only into the
// directory that pointer names (Resolve). So a DEL is answered success only when it
// sits where the agent serving that socket reads, and there is no second setting to
// keep in step with the agent's by hand.
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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ipledger/ipledger/internal/api"
)

// Bounds on the spool: a full spool refuses new entries (the DEL then fails and the
// runtime retries it) rather than growing without limit.
const (
	MaxEntries   = 16384
	MaxEntrySize = 4096
)

// MaxRejected bounds the entries kept in the rejected/ subdirectory (each with its
// reason file). They are kept so that an operator can see why a DEL was not
// applied; a writer that keeps leaving bad entries (a plugin of another version, a
// damaged disk, a misbehaving root process) would otherwise grow the directory
// without bound, and an incident repeats one reason, so 256 is far more than it
// takes to understand one while keeping the directory small to list. When a new
// entry is moved in beyond the bound, the oldest are removed (Dir.TakeDropped
// counts them). Entries still in the spool are never touched by this.
const MaxRejected = 256

// rejectedDir is the subdirectory of a spool where bad entries are moved.
const rejectedDir = "rejected"

// StaleTemp is how long a temporary file may sit in the spool before the agent
// removes it. A plugin holds its temporary file for the milliseconds between create
// and rename; one left behind was abandoned by a plugin that died (its DEL was never
// answered success, so the runtime retries it). Ten minutes is far beyond any CNI
// call's lifetime (runtimes time out a plugin after minutes at most).
const StaleTemp = 10 * time.Minute

// Errors of the package.
var (
	// ErrFull: the spool holds MaxEntries entries already.
	ErrFull = errors.New("DEL spool full")
	// ErrNoSpool: no agent has published a spool for the socket, or what is published
	// is not safe to write to. The DEL must fail (the runtime retries it).
	ErrNoSpool = errors.New("no DEL spool published for the socket")
	// ErrRejected: an entry was not what the plugin writes (owner, mode, content) and
	// was moved to the rejected/ subdirectory with its reason, unapplied.
	ErrRejected = errors.New("spool entry rejected")
)

// Entry is one spooled DEL. Spooled is the plugin's wall clock when it wrote the
// entry: shown in logs and release records, never used to order anything (a wall
// clock steps).
type Entry struct {
	Version   int       `json:"version"`
	Key       api.Key   `json:"key"`
	Spooled   time.Time `json:"spooled"`
	CNIVerb   string    `json:"verb"`
	PodUID    string    `json:"podUID,omitempty"`
	SpooledBy string    `json:"spooledBy,omitempty"`
}

const (
	suffix    = ".del"
	tmpPrefix = ".tmp-"
	// PointerSuffix names the pointer an agent publishes next to its socket.
	PointerSuffix = ".spool"
)

// fileName names an attachment's entry. The name only deduplicates repeated DELs of
// one attachment (the key itself is inside the entry), so a 128-bit FNV-1a is enough;
// a cryptographic hash would pull Go's crypto initialisation into the plugin, which is
// exec'd on every pod start.
func fileName(k api.Key) string {
	h := fnv.New128a()
	h.Write([]byte(k.Network + "\x00" + k.ContainerID + "\x00" + k.IfName))
	return hex.EncodeToString(h.Sum(nil)) + suffix
}

// Pointer is the path of the spool pointer of the agent serving socket.
func Pointer(socket string) string { return socket + PointerSuffix }

// Publish makes dir (created 0700 if missing) the spool of the agent serving socket:
// it checks dir is safe (a root-owned directory nobody else may write) and replaces
// the pointer SOCKET.spool atomically with a symlink to dir's absolute path. The agent
// calls it at start, after it owns the socket. The pointer outlives the agent on
// purpose: while the agent is down, plugins spool where it will read when it is back.
func Publish(socket, dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("DEL spool %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return fmt.Errorf("DEL spool %s: %w", abs, err)
	}
	if err := checkDir(abs); err != nil {
		return err
	}
	ptr := Pointer(socket)
	tmp := fmt.Sprintf("%s.tmp-%d", ptr, os.Getpid())
	os.Remove(tmp)
	if err := os.Symlink(abs, tmp); err != nil {
		return fmt.Errorf("publishing the DEL spool at %s: %w", ptr, err)
	}
	if err := os.Rename(tmp, ptr); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("publishing the DEL spool at %s: %w", ptr, err)
	}
	return syncDir(filepath.Dir(ptr))
}

// Resolve returns the spool directory published for socket, after checking that the
// pointer is a symlink owned by root naming an absolute path, and that the directory
// is owned by root and writable by nobody else. Anything else is ErrNoSpool with the
// reason: the plugin then fails the DEL rather than spool where no agent reads.
func Resolve(socket string) (string, error) {
	ptr := Pointer(socket)
	fi, err := os.Lstat(ptr)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%w: %s does not exist (ipledgerd publishes it when it starts serving %s; it has not run since boot, or serves another socket)", ErrNoSpool, ptr, socket)
	}
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoSpool, err)
	}
	if fi.Mode()&os.ModeSymlink == 0 {
		return "", fmt.Errorf("%w: %s is not a symlink (ipledgerd writes a symlink to its spool there); remove it and restart ipledgerd", ErrNoSpool, ptr)
	}
	if uid := ownerOf(fi); uid != 0 {
		return "", fmt.Errorf("%w: %s is owned by uid %d, not root; remove it and restart ipledgerd", ErrNoSpool, ptr, uid)
	}
	dir, err := os.Readlink(ptr)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoSpool, err)
	}
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("%w: %s points to %q, not an absolute path; remove it and restart ipledgerd", ErrNoSpool, ptr, dir)
	}
	if err := checkDir(dir); err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrNoSpool, ptr, err)
	}
	return dir, nil
}

// checkDir: dir is a directory owned by root that neither group nor others may write.
func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("DEL spool %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("DEL spool %s is not a directory", dir)
	}
	if uid := ownerOf(fi); uid != 0 {
		return fmt.Errorf("DEL spool %s is owned by uid %d, not root", dir, uid)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("DEL spool %s has mode %v: group or others may write it; chmod go-w it", dir, fi.Mode().Perm())
	}
	return nil
}

func ownerOf(fi os.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}

// Write stores e durably in dir, a directory Resolve returned. Writing the same
// attachment twice keeps one entry.
func Write(dir string, e Entry) error {
	if err := e.Key.Validate(); err != nil {
		return err
	}
	name := filepath.Join(dir, fileName(e.Key))
	if _, err := os.Lstat(name); err != nil {
		n, err := count(dir)
		if err != nil {
			return fmt.Errorf("DEL spool %s: %w", dir, err)
		}
		if n >= MaxEntries {
			return fmt.Errorf("%w: %s holds %d entries; start ipledgerd to apply them", ErrFull, dir, n)
		}
	}
	e.Version = 1
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, tmpPrefix+"*")
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

// count is the number of entries in dir: temporary files and rejected entries do not
// count against the limit.
func count(dir string) (int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, de := range ents {
		if isEntry(de) {
			n++
		}
	}
	return n, nil
}

func isEntry(de os.DirEntry) bool {
	return !de.IsDir() && strings.HasSuffix(de.Name(), suffix) && !strings.HasPrefix(de.Name(), tmpPrefix)
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

// Dir is the agent's side of a spool directory. Its methods are safe for concurrent
// use; Take of one key must be serialized by the caller with everything else that
// changes that attachment's lease (the agent holds the attachment's lock).
type Dir struct {
	path string
	// mono is the agent's elapsed-time clock: temporary files are judged stale by how
	// long this agent has seen them, which no wall-clock step can hurry.
	mono func() time.Duration

	mu      sync.Mutex
	tmpSeen map[string]time.Duration
	dropped int // rejected entries removed to keep MaxRejected, not yet taken
	// rejecting serializes moves into rejected/ (each takes the next number there)
	rejecting sync.Mutex
}

// Open returns the agent's view of the spool at path; mono is its monotonic clock.
func Open(path string, mono func() time.Duration) *Dir {
	return &Dir{path: path, mono: mono, tmpSeen: map[string]time.Duration{}}
}

// Path is the directory.
func (d *Dir) Path() string { return d.path }

// Pending lists the attachments with an entry in the spool, sorted, and tidies the
// directory: entries that are not what the plugin writes are moved to rejected/ (each
// such rejection is among the returned errors, wrapping ErrRejected), and temporary
// files this agent has seen for StaleTemp or longer are removed.
func (d *Dir) Pending() ([]api.Key, error) {
	ents, err := os.ReadDir(d.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("DEL spool %s: %w", d.path, err)
	}
	var keys []api.Key
	var errs []error
	now := d.mono()
	seen := map[string]bool{}
	for _, de := range ents {
		name := de.Name()
		if strings.HasPrefix(name, tmpPrefix) {
			seen[name] = true
			d.mu.Lock()
			first, ok := d.tmpSeen[name]
			if !ok {
				d.tmpSeen[name] = now
			}
			d.mu.Unlock()
			if ok && now-first >= StaleTemp {
				if err := os.Remove(filepath.Join(d.path, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, fmt.Errorf("DEL spool %s: removing stale %s: %w", d.path, name, err))
				}
			}
			continue
		}
		if de.IsDir() || !strings.HasSuffix(name, suffix) {
			continue
		}
		p := filepath.Join(d.path, name)
		e, err := read(p)
		if errors.Is(err, os.ErrNotExist) {
			continue // taken since the listing
		}
		if err != nil {
			errs = append(errs, d.reject(p, err))
			continue
		}
		keys = append(keys, e.Key)
	}
	d.mu.Lock()
	for name := range d.tmpSeen {
		if !seen[name] {
			delete(d.tmpSeen, name)
		}
	}
	d.mu.Unlock()
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	return keys, errors.Join(errs...)
}

// Take applies the pending entry of attachment k, if there is one: it reads the entry
// (checking owner, mode and content; a bad one is rejected, and Take returns an error
// wrapping ErrRejected), calls release, and once release returned nil removes the
// entry durably (the directory is fsync'd before Take returns, so an applied entry
// can never come back after a crash to release a lease handed out later). It reports
// whether an entry was applied. An error from release leaves the entry in place.
func (d *Dir) Take(k api.Key, release func(Entry) error) (bool, error) {
	p := filepath.Join(d.path, fileName(k))
	e, err := read(p)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, d.reject(p, err)
	}
	if e.Key != k {
		return false, d.reject(p, fmt.Errorf("entry for %s stored under the name of %s", e.Key, k))
	}
	if err := release(e); err != nil {
		return false, fmt.Errorf("spooled DEL of %s: %w", k, err)
	}
	if err := os.Remove(p); err != nil {
		return false, fmt.Errorf("DEL spool %s: removing the applied entry of %s: %w", d.path, k, err)
	}
	if err := syncDir(d.path); err != nil {
		return false, err
	}
	return true, nil
}

// Len counts the entries waiting in the spool.
func (d *Dir) Len() int { return Len(d.path) }

// Len counts the entries waiting in dir.
func Len(dir string) int {
	n, _ := count(dir)
	return n
}

// read opens p without following a symlink and checks it is what the plugin writes:
// a regular file owned by root that neither group nor others may write, at most
// MaxEntrySize bytes of a version 1 entry stored under its key's name.
func read(p string) (Entry, error) {
	var e Entry
	// O_NONBLOCK: a FIFO planted in the spool must not hang the agent
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, syscall.ELOOP) {
		return e, errors.New("a symlink, not a file the plugin wrote")
	}
	if err != nil {
		return e, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return e, err
	}
	if !fi.Mode().IsRegular() {
		return e, fmt.Errorf("not a regular file (mode %v)", fi.Mode())
	}
	if uid := ownerOf(fi); uid != 0 {
		return e, fmt.Errorf("owned by uid %d, not root: not written by the plugin", uid)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return e, fmt.Errorf("mode %v: group or others may write it, so its content cannot be trusted", fi.Mode().Perm())
	}
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

// reject moves p to rejected/ as NUMBER-NAME (NUMBER one more than any there, so the
// names sort oldest first) with a file NUMBER-NAME.why giving the reason: a bad entry
// is never applied and never silently dropped. Beyond MaxRejected entries there, the
// oldest are removed, counted for TakeDropped and named in the error.
func (d *Dir) reject(p string, why error) error {
	d.rejecting.Lock()
	defer d.rejecting.Unlock()
	base := filepath.Base(p)
	rdir := filepath.Join(d.path, rejectedDir)
	if err := os.MkdirAll(rdir, 0o700); err != nil {
		return fmt.Errorf("%w: %s (%v), and it could not be moved aside: %v", ErrRejected, base, why, err)
	}
	kept, err := listRejected(rdir)
	if err != nil {
		return fmt.Errorf("%w: %s (%v), and it could not be moved aside: %v", ErrRejected, base, why, err)
	}
	seq := uint64(1)
	if len(kept) > 0 {
		seq = kept[len(kept)-1].seq + 1
	}
	name := fmt.Sprintf("%0*d-%s", seqDigits, seq, base)
	dst := filepath.Join(rdir, name)
	if err := os.Rename(p, dst); err != nil {
		return fmt.Errorf("%w: %s (%v), and it could not be moved aside: %v", ErrRejected, base, why, err)
	}
	os.WriteFile(dst+whySuffix, []byte(why.Error()+"\n"), 0o600)
	msg := fmt.Sprintf("%s (kept in %s as %s): %v", base, rdir, name, why)
	if over := len(kept) + 1 - MaxRejected; over > 0 {
		n, err := dropRejected(rdir, kept[:over])
		d.mu.Lock()
		d.dropped += n
		d.mu.Unlock()
		msg += fmt.Sprintf("; removed the %d oldest rejected entries to keep at most %d", n, MaxRejected)
		if err != nil {
			msg += fmt.Sprintf(" (%v)", err)
		}
	}
	return fmt.Errorf("%w: %s", ErrRejected, msg)
}

// TakeDropped returns how many rejected entries were removed to keep MaxRejected
// since the last call.
func (d *Dir) TakeDropped() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.dropped
	d.dropped = 0
	return n
}

const (
	whySuffix = ".why"
	seqDigits = 10
)

// rejected is one entry of rejected/: its name and that of its reason file, either
// of which may be missing, and its number (0 for a name reject did not make).
type rejected struct {
	name string
	seq  uint64
}

// listRejected lists the entries of rdir, oldest first: by number, then by name.
func listRejected(rdir string) ([]rejected, error) {
	ents, err := os.ReadDir(rdir)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []rejected
	for _, de := range ents {
		name := strings.TrimSuffix(de.Name(), whySuffix)
		if seen[name] {
			continue
		}
		seen[name] = true
		r := rejected{name: name}
		if i := strings.IndexByte(name, '-'); i == seqDigits {
			if n, err := strconv.ParseUint(name[:i], 10, 64); err == nil {
				r.seq = n
			}
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].seq != out[j].seq {
			return out[i].seq < out[j].seq
		}
		return out[i].name < out[j].name
	})
	return out, nil
}

// dropRejected removes the entries rs of rdir with their reason files, and reports
// how many it removed.
func dropRejected(rdir string, rs []rejected) (int, error) {
	n := 0
	var errs []error
	for _, r := range rs {
		p := filepath.Join(rdir, r.name)
		err := os.RemoveAll(p) // an entry may be a directory or a symlink (not followed)
		if err == nil {
			err = os.Remove(p + whySuffix)
			if errors.Is(err, os.ErrNotExist) {
				err = nil
			}
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
