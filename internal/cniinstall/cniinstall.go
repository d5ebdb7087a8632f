// Package cniinstall puts a CNI network on a node the way a runtime must see
// it: plugin binaries into the host's CNI bin dir and the network's conflist
// into the host's CNI conf dir, each file written to a temporary name in the
// destination directory, fsync'd, then renamed over the old one, so a runtime
// (or kubelet) scanning the directory never reads half a file or runs half a
// binary. It is what `ipledgerd install-cni` runs in the DaemonSet's init
// container (deploy/ipledger.yaml), and Uninstall (`ipledgerd uninstall-cni`)
// takes it off again.
//
// Which plugins it installed is recorded beside the conflist (RecordPath), so
// that Uninstall removes those and nothing else: a shared plugin such as
// portmap is installed only where the node has none, and a portmap the
// operator put there stays when ipledger goes.
package cniinstall

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// RecordSuffix ends the name of the record of installed plugins, beside the
// conflist (10-ipledger.conflist.installed): not .conf, .conflist or .json, so
// no runtime reads it as a network.
const RecordSuffix = ".installed"

// Options says what to install where, and for Uninstall what to remove.
type Options struct {
	// SrcDir holds the plugin binaries (in the image: /usr/local/bin).
	SrcDir string
	// Plugins are ipledger's own binaries: Install copies each from SrcDir to
	// BinDir, replacing what is there; Uninstall removes them.
	Plugins []string
	// Shared are plugins other networks may use too (portmap): Install copies
	// one only when BinDir has none or the one there is recorded as installed
	// by an earlier Install; Uninstall removes only those recorded.
	Shared []string
	// BinDir is the host's CNI bin dir as mounted in the container.
	BinDir string
	// Conflist is the path of the conflist to install (a ConfigMap key).
	Conflist string
	// ConfDir is the host's CNI conf dir as mounted in the container.
	ConfDir string
	// ConfName is the installed conflist's file name, e.g. 10-ipledger.conflist
	// (runtimes use the lexically first file of the dir).
	ConfName string
	// CNIVersion is the installed conflist's cniVersion: VersionAuto (also
	// when empty: what Runtime loads, 1.1.0 on containerd 2.0.1+), VersionKeep
	// (the conflist's own) or one of Versions (the operator's: it wins, unless
	// Runtime would refuse it).
	CNIVersion string
	// Runtime is the node's runtime as its CRI Version call named it; nil:
	// not asked (VersionAuto then keeps the conflist's own).
	Runtime *RuntimeInfo
	// Cleanups are what Uninstall runs once the conflist and plugins are gone,
	// for state of the network beyond its files (routes, netfilter rules).
	Cleanups []Cleanup
}

// Cleanup removes something the network left on the node. It must succeed on
// what is already gone: a failed Uninstall is run again.
type Cleanup func() error

// Installed is what Install did, for the log.
type Installed struct {
	// Files written, the conflist last.
	Files []string
	// Kept are the shared plugins left as they were: BinDir had them, not
	// installed by ipledger.
	Kept []string
	// Record is the record of the installed plugins (RecordPath).
	Record string
	// CNIVersion is the installed conflist's cniVersion, and
	// CNIVersionReason why (ChooseCNIVersion).
	CNIVersion, CNIVersionReason string
}

// RecordPath is the record of the plugins Install installed: ConfName with
// RecordSuffix, in ConfDir.
func RecordPath(o Options) string {
	return filepath.Join(o.ConfDir, o.ConfName+RecordSuffix)
}

// record is the file at RecordPath.
type record struct {
	// Plugins are the binaries in BinDir that ipledger installed.
	Plugins []string `json:"plugins"`
}

// readRecord reads the record at RecordPath; none is an empty record.
func readRecord(o Options) (record, error) {
	var r record
	b, err := os.ReadFile(RecordPath(o))
	if errors.Is(err, os.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return r, fmt.Errorf("%w: %v", ErrBadRecord, err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%w: %s: %v (remove it to start afresh; then a shared plugin there counts as the operator's)", ErrBadRecord, RecordPath(o), err)
	}
	for _, p := range r.Plugins {
		if checkPluginName(p) != nil {
			return r, fmt.Errorf("%w: %s names %q, not a file name", ErrBadRecord, RecordPath(o), p)
		}
	}
	return r, nil
}

func checkConfName(name string) error {
	if name == "" || strings.ContainsRune(name, '/') || !strings.HasSuffix(name, ".conflist") {
		return fmt.Errorf("cniinstall: conf name %q: give a file name ending in .conflist, e.g. 10-ipledger.conflist", name)
	}
	return nil
}

func checkPluginName(p string) error {
	if p == "" || p == "." || p == ".." || strings.ContainsRune(p, '/') {
		return fmt.Errorf("cniinstall: plugin name %q: give a file name in the source dir", p)
	}
	return nil
}

// Install copies each plugin and then the conflist (last: once the runtime
// sees the network, its plugins are in place). The conflist is checked first:
// valid JSON with cniVersion, name and at least one plugin with a type, each
// type among the installed plugins or already present in BinDir. The record
// of what it installs is written before the first plugin is copied, so that no
// plugin it copied is ever taken for the operator's.
func Install(o Options) (Installed, error) {
	var done Installed
	if err := checkConfName(o.ConfName); err != nil {
		return done, err
	}
	conf, err := os.ReadFile(o.Conflist)
	if err != nil {
		return done, fmt.Errorf("cniinstall: conflist: %w", err)
	}
	types, err := check(conf)
	if err != nil {
		return done, fmt.Errorf("%w: %s: %v", ErrBadConflist, o.Conflist, err)
	}
	own := conflistVersion(conf)
	done.CNIVersion, done.CNIVersionReason, err = ChooseCNIVersion(o.CNIVersion, own, o.Runtime)
	if err != nil {
		return done, err
	}
	for _, p := range append(slices.Clone(o.Plugins), o.Shared...) {
		if err := checkPluginName(p); err != nil {
			return done, err
		}
	}
	prev, err := readRecord(o)
	if err != nil {
		return done, err
	}
	install := slices.Clone(o.Plugins)
	for _, p := range o.Shared {
		if slices.Contains(install, p) {
			continue
		}
		_, err := os.Lstat(filepath.Join(o.BinDir, p))
		switch {
		case slices.Contains(prev.Plugins, p), errors.Is(err, os.ErrNotExist):
			install = append(install, p)
		case err != nil:
			return done, fmt.Errorf("cniinstall: %w", err)
		default:
			done.Kept = append(done.Kept, p)
		}
	}
	// Still ours: what an earlier Install put there and is still there.
	rec := record{Plugins: slices.Clone(install)}
	for _, p := range prev.Plugins {
		if _, err := os.Lstat(filepath.Join(o.BinDir, p)); err == nil && !slices.Contains(rec.Plugins, p) {
			rec.Plugins = append(rec.Plugins, p)
		}
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return done, fmt.Errorf("cniinstall: record: %w", err)
	}
	if err := writeAtomic(RecordPath(o), bytes.NewReader(append(b, '\n')), 0o644); err != nil {
		return done, err
	}
	done.Record = RecordPath(o)
	for _, p := range install {
		src, err := os.Open(filepath.Join(o.SrcDir, p))
		if err != nil {
			return done, fmt.Errorf("cniinstall: plugin: %w", err)
		}
		dst := filepath.Join(o.BinDir, p)
		err = writeAtomic(dst, src, 0o755)
		src.Close()
		if err != nil {
			return done, err
		}
		done.Files = append(done.Files, dst)
	}
	for _, t := range types {
		// Lstat: a symlink in the host's dir may point where this container
		// cannot see (e.g. /opt/cni/bin/bridge -> /usr/lib/cni/bridge); the
		// runtime on the host resolves it.
		if _, err := os.Lstat(filepath.Join(o.BinDir, t)); err != nil {
			return done, fmt.Errorf("%w: plugin type %q is not in %s (%v): install it or fix the conflist's type", ErrBadConflist, t, o.BinDir, err)
		}
	}
	var theirs []string // the chain's plugins Install did not put there
	for _, t := range types {
		if !slices.Contains(install, t) {
			theirs = append(theirs, t)
		}
	}
	if done.CNIVersion, done.CNIVersionReason, err = chainVersion(o, done.CNIVersion, done.CNIVersionReason, theirs); err != nil {
		return done, err
	}
	if done.CNIVersion != own {
		if conf, err = WithCNIVersion(conf, done.CNIVersion); err != nil {
			return done, err
		}
	}
	dst := filepath.Join(o.ConfDir, o.ConfName)
	if err := writeAtomic(dst, strings.NewReader(string(conf)), 0o644); err != nil {
		return done, err
	}
	done.Files = append(done.Files, dst)
	return done, nil
}

// Uninstalled is what Uninstall did, for the log.
type Uninstalled struct {
	// Removed are the files removed, the conflist first.
	Removed []string
	// Missing are the files Uninstall was to remove and did not find.
	Missing []string
}

// Uninstall is Install's reverse: it removes the conflist (first: the runtime
// stops using the network before its plugins go), then Plugins and the plugins
// the record names (what Install installed; a shared plugin the operator put
// there is not in it), then runs Cleanups, and removes the record last, when
// everything else succeeded, so that a failed Uninstall can be run again. The
// conflist or one of Plugins not found is an error wrapping ErrNotFound that names
// each (the directories are not where ipledger was installed: an uninstall that
// removes nothing must not look like one that worked), after everything else was
// done; while the record is there (an earlier Uninstall failed after removing
// files) a file already gone is not. It touches nothing else: the agent's ledger
// (/var/lib/ipledger) stays.
func Uninstall(o Options) (Uninstalled, error) {
	var done Uninstalled
	if err := checkConfName(o.ConfName); err != nil {
		return done, err
	}
	for _, p := range o.Plugins {
		if err := checkPluginName(p); err != nil {
			return done, err
		}
	}
	var errs []error
	rec, err := readRecord(o)
	if err != nil {
		// Our own plugins and the conflist still go; shared ones are left.
		errs = append(errs, err)
	}
	_, serr := os.Lstat(RecordPath(o))
	resumed := serr == nil // an earlier Uninstall failed after removing files
	remove := func(p string) {
		switch err := os.Remove(p); {
		case err == nil:
			done.Removed = append(done.Removed, p)
		case errors.Is(err, os.ErrNotExist):
			if p != RecordPath(o) && !resumed {
				done.Missing = append(done.Missing, p)
			}
		default:
			errs = append(errs, fmt.Errorf("cniinstall: %w", err))
		}
	}
	remove(filepath.Join(o.ConfDir, o.ConfName))
	plugins := slices.Clone(o.Plugins)
	for _, p := range rec.Plugins {
		if !slices.Contains(plugins, p) {
			plugins = append(plugins, p)
		}
	}
	for _, p := range plugins {
		remove(filepath.Join(o.BinDir, p))
	}
	for i, c := range o.Cleanups {
		if err := c(); err != nil {
			errs = append(errs, fmt.Errorf("cniinstall: cleanup %d: %w", i+1, err))
		}
	}
	if len(errs) == 0 {
		remove(RecordPath(o))
	}
	for _, dir := range []string{o.ConfDir, o.BinDir} {
		if err := syncDir(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(done.Missing) > 0 {
		var absent []string
		for _, dir := range []string{o.ConfDir, o.BinDir} {
			if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
				absent = append(absent, dir)
			}
		}
		hint := "already removed, or never installed in these directories"
		if len(absent) > 0 {
			hint = "no directory " + strings.Join(absent, " nor ")
		}
		errs = append(errs, fmt.Errorf("%w: %s (%s); on a node itself give --cni-bin-dir /opt/cni/bin --cni-conf-dir /etc/cni/net.d, or the dirs your runtime's CNI config names",
			ErrNotFound, strings.Join(done.Missing, ", "), hint))
	}
	return done, errors.Join(errs...)
}

// check returns the plugin types (and IPAM types) a conflist names.
func check(conf []byte) ([]string, error) {
	var c struct {
		CNIVersion string `json:"cniVersion"`
		Name       string `json:"name"`
		Plugins    []struct {
			Type string `json:"type"`
			IPAM *struct {
				Type string `json:"type"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(conf, &c); err != nil {
		return nil, fmt.Errorf("not JSON: %v", err)
	}
	if c.CNIVersion == "" {
		return nil, errors.New(`"cniVersion" is missing: set one, e.g. "1.0.0" (install-cni's --cni-version auto then writes the one the node's runtime loads)`)
	}
	if c.Name == "" {
		return nil, errors.New(`"name" is missing: name the network (it names the pool)`)
	}
	if len(c.Plugins) == 0 {
		return nil, errors.New(`"plugins" is empty: a conflist needs at least one plugin`)
	}
	var types []string
	for i, p := range c.Plugins {
		if p.Type == "" {
			return nil, fmt.Errorf(`plugins[%d]: "type" is missing`, i)
		}
		types = append(types, p.Type)
		if p.IPAM != nil && p.IPAM.Type != "" {
			types = append(types, p.IPAM.Type)
		}
	}
	return types, nil
}

// writeAtomic writes r to a temporary file in dst's directory, fsyncs it,
// sets mode, renames it over dst and fsyncs the directory.
func writeAtomic(dst string, r io.Reader, mode os.FileMode) error {
	dir := filepath.Dir(dst)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(dst)+".tmp-*")
	if err != nil {
		return fmt.Errorf("cniinstall: %w", err)
	}
	name := tmp.Name()
	fail := func(err error) error {
		tmp.Close()
		os.Remove(name)
		return fmt.Errorf("cniinstall: write %s: %w", dst, err)
	}
	if _, err := io.Copy(tmp, r); err != nil {
		return fail(err)
	}
	if err := tmp.Chmod(mode); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(name)
		return fmt.Errorf("cniinstall: write %s: %w", dst, err)
	}
	if err := os.Rename(name, dst); err != nil {
		os.Remove(name)
		return fmt.Errorf("cniinstall: %w", err)
	}
	return syncDir(dir)
}

// syncDir fsyncs dir, making the renames and removals in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("cniinstall: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("cniinstall: fsync %s: %w", dir, err)
	}
	return nil
}
