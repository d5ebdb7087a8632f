package walstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/store/boltstore"
)

// The state file is created whole: bbolt would create ledger.db and only then write
// its first pages, and a kill between the two leaves an empty file that bbolt cannot
// tell from a new one (boltstore refuses it, lest an emptied ledger be taken for a new
// one). So a missing ledger.db is written as a temporary file beside it (bbolt's
// pages, the ledger's buckets, fsync'd by bbolt's commits) and linked into place with
// link(2), which never replaces a file another agent created meanwhile; the directory
// is fsync'd after. A kill before the link leaves a temporary file, removed at the
// next start; after it, a complete ledger.db.
//
// An empty ledger.db can still be found: an older ipledgerd killed during its first
// start left one. Every record an agent ever acknowledged is either in ledger.db
// (a non-empty file) or in the log; an empty ledger.db whose log files hold no record
// (any identity) has acknowledged nothing, and is replaced by a new one, with a
// warning. One whose log holds a record is refused as before: those records were
// acknowledged, and the identity that would tell them apart is gone with ledger.db.

// tempPattern names the temporary files of a state file being created.
func tempPattern(path string) string { return filepath.Base(path) + ".creating-*" }

// prepare makes sure a complete state file exists at s.path before bbolt opens it.
func (s *Store) prepare() error {
	dir := filepath.Dir(s.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("%w: state directory %s: %v", ledger.ErrStore, dir, err)
	}
	fi, err := os.Stat(s.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return s.create()
	case err != nil:
		return fmt.Errorf("%w: state file %s: %v", ledger.ErrStore, s.path, err)
	case fi.Mode().IsRegular() && fi.Size() == 0:
		return s.replaceEmpty()
	}
	return nil
}

// create writes a new state file at s.path, unless another agent does so first.
func (s *Store) create() error {
	tmp, err := s.writeNew()
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	err = os.Link(tmp, s.path)
	if errors.Is(err, fs.ErrExist) {
		return nil // another agent created it first: its lock decides who serves
	}
	if err != nil {
		if _, serr := os.Stat(s.path); serr == nil {
			return nil // another agent created it, and removed this temporary file
		}
		return fmt.Errorf("%w: state file %s: creating it: %v", ledger.ErrStore, s.path, err)
	}
	at("create-linked")
	return s.syncDir()
}

// replaceEmpty replaces an empty state file by a new one when its log holds no
// record. It holds an exclusive lock on the empty file meanwhile, so that two agents
// starting at once do not both replace it.
func (s *Store) replaceEmpty() error {
	f, err := os.Open(s.path)
	if err != nil {
		return fmt.Errorf("%w: state file %s: %v", ledger.ErrStore, s.path, err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("%w: %w: state file %s is locked by another process; is another ipledgerd running with --state-dir %s?", ledger.ErrStore, boltstore.ErrLocked, s.path, filepath.Dir(s.path))
		}
		return fmt.Errorf("%w: state file %s: %v", ledger.ErrStore, s.path, err)
	}
	held, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%w: state file %s: %v", ledger.ErrStore, s.path, err)
	}
	if now, err := os.Stat(s.path); err != nil || !os.SameFile(held, now) || now.Size() != 0 {
		return nil // another agent replaced it meanwhile
	}
	if withRecord, err := logWithRecord(s.path); err != nil {
		return err
	} else if withRecord != "" {
		return s.corrupt(fmt.Errorf("the file is empty while its write-ahead log %s holds records", withRecord))
	}
	tmp, err := s.writeNew()
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := os.Rename(tmp, s.path); err != nil {
		return fmt.Errorf("%w: state file %s: replacing the empty file: %v", ledger.ErrStore, s.path, err)
	}
	at("create-linked")
	if err := s.syncDir(); err != nil {
		return err
	}
	s.log.Warn("the state file was empty and its write-ahead log holds no record: an earlier start was stopped before it wrote the file, and nothing was acknowledged from it; starting with a new, empty ledger",
		"path", s.path)
	return nil
}

// writeNew writes a complete, empty ledger to a new temporary file beside s.path and
// returns its path. Temporary files left by earlier starts are removed first.
func (s *Store) writeNew() (string, error) {
	dir := filepath.Dir(s.path)
	if old, err := filepath.Glob(filepath.Join(dir, tempPattern(s.path))); err == nil {
		for _, p := range old {
			os.Remove(p)
		}
	}
	f, err := os.CreateTemp(dir, tempPattern(s.path))
	if err != nil {
		return "", fmt.Errorf("%w: state directory %s: creating the state file: %v", ledger.ErrStore, dir, err)
	}
	tmp := f.Name()
	f.Close()
	// bbolt takes the empty temporary file for a new one and writes its pages; the
	// ledger's buckets are the first commit. Both are fdatasync'd by bbolt.
	os.Remove(tmp)
	bs, err := boltstore.Open(tmp, s.boltOpts...)
	if err != nil {
		os.Remove(tmp)
		return "", err
	}
	if err := bs.Close(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("%w: state file %s: %v", ledger.ErrStore, tmp, err)
	}
	at("create-written")
	return tmp, nil
}

func (s *Store) syncDir() error {
	if err := syncDir(filepath.Dir(s.path)); err != nil {
		return fmt.Errorf("%w: state directory %s: %v", ledger.ErrStore, filepath.Dir(s.path), err)
	}
	return nil
}

// logWithRecord returns the first log file of the state file at path that holds an
// intact record of any log identity, or "" when none does (missing files hold none).
func logWithRecord(path string) (string, error) {
	for _, p := range LogPaths(path) {
		data, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("%w: write-ahead log %s: %v", ledger.ErrStore, p, err)
		}
		for pos := 0; pos+headerSize <= len(data); pos += recAlign {
			logID := binary.LittleEndian.Uint64(data[pos+16:])
			if _, _, _, ok := parseRecord(data, pos, logID); ok {
				return p, nil
			}
		}
	}
	return "", nil
}
