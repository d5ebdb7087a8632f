// Package cniinstall puts a CNI network on a node the way a runtime must see
// it: plugin binaries into the host's CNI bin dir and the network's conflist
// into the host's CNI conf dir, each file written to a temporary name in the
// destination directory, fsync'd, then renamed over the old one, so a runtime
// (or kubelet) scanning the directory never reads half a file or runs half a
// binary. It is what `ipledgerd install-cni` runs in the DaemonSet's init
// container (deploy/ipledger.yaml).
package cniinstall

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// ErrBadConflist is returned for a conflist that no runtime would load.
var ErrBadConflist = errors.New("cniinstall: bad conflist")

// Options says what to install where.
type Options struct {
	// SrcDir holds the plugin binaries (in the image: /usr/local/bin).
	SrcDir string
	// Plugins are the binaries' names to copy from SrcDir to BinDir.
	Plugins []string
	// BinDir is the host's CNI bin dir as mounted in the container.
	BinDir string
	// Conflist is the path of the conflist to install (a ConfigMap key).
	Conflist string
	// ConfDir is the host's CNI conf dir as mounted in the container.
	ConfDir string
	// ConfName is the installed conflist's file name, e.g. 10-ipledger.conflist
	// (runtimes use the lexically first file of the dir).
	ConfName string
}

// Installed is what Install did, for the log.
type Installed struct {
	Files []string
}

// Install copies each plugin and then the conflist (last: once the runtime
// sees the network, its plugins are in place). The conflist is checked first:
// valid JSON with cniVersion, name and at least one plugin with a type, each
// type among the installed plugins or already present in BinDir.
func Install(o Options) (Installed, error) {
	var done Installed
	if o.ConfName == "" || strings.ContainsRune(o.ConfName, '/') || !strings.HasSuffix(o.ConfName, ".conflist") {
		return done, fmt.Errorf("cniinstall: conf name %q: give a file name ending in .conflist, e.g. 10-ipledger.conflist", o.ConfName)
	}
	conf, err := os.ReadFile(o.Conflist)
	if err != nil {
		return done, fmt.Errorf("cniinstall: conflist: %w", err)
	}
	types, err := check(conf)
	if err != nil {
		return done, fmt.Errorf("%w: %s: %v", ErrBadConflist, o.Conflist, err)
	}
	for _, p := range o.Plugins {
		if p == "" || strings.ContainsRune(p, '/') {
			return done, fmt.Errorf("cniinstall: plugin name %q: give a file name in the source dir", p)
		}
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
	dst := filepath.Join(o.ConfDir, o.ConfName)
	if err := writeAtomic(dst, strings.NewReader(string(conf)), 0o644); err != nil {
		return done, err
	}
	done.Files = append(done.Files, dst)
	return done, nil
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
		return nil, errors.New(`"cniVersion" is missing: set one the node's runtime accepts (containerd 1.6: "1.0.0")`)
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
