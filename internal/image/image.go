// Package image builds container images as docker-archive tarballs, without a
// Docker daemon, a registry or the network, using go-containerregistry. Every
// timestamp is fixed (the Unix epoch) and entries are written in a fixed
// order, so the same inputs give a byte-identical tarball.
//
// A docker-archive is what `ctr -n k8s.io images import`, `docker load` and
// `podman load` read.
package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Epoch is the timestamp of every file, the layer and the image config.
var Epoch = time.Unix(0, 0).UTC()

// File is one regular file of the image's single layer.
type File struct {
	// Path inside the image, absolute or relative to /, e.g. "usr/local/bin/ipledgerd".
	Path string
	Mode int64
	Data []byte
	// Link, when set, makes the entry a symbolic link to Link (Mode and Data
	// unused), e.g. "usr/bin" for "bin" on a merged-/usr system.
	Link string
}

// Spec describes an image.
type Spec struct {
	// Tag is the reference the archive names, e.g. "ipledger:dev".
	Tag string
	// Files of the single layer. Parent directories are added (mode 0755).
	Files []File
	// Dirs are extra empty directories (mode 0755), e.g. "tmp" (0 means 0755;
	// "tmp" gets 01777).
	Dirs []string
	// Entrypoint, Cmd, Env and WorkingDir of the image config.
	Entrypoint, Cmd, Env []string
	WorkingDir           string
	// Arch is the image's architecture; empty means runtime.GOARCH.
	Arch string
}

// ErrBadSpec is returned for a Spec that cannot become an image.
var ErrBadSpec = errors.New("image: bad spec")

// Write builds the image described by spec and writes it as a docker-archive
// to w.
func Write(spec Spec, w io.Writer) error {
	tag, err := name.NewTag(spec.Tag)
	if err != nil {
		return fmt.Errorf("%w: tag %q: %v (use NAME:TAG, e.g. ipledger:dev)", ErrBadSpec, spec.Tag, err)
	}
	img, err := Image(spec)
	if err != nil {
		return err
	}
	return tarball.Write(tag, img, w)
}

// WriteFile writes the docker-archive to path atomically (temporary file in
// the same directory, fsync, rename).
func WriteFile(spec Spec, p string) error {
	tmp, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := Write(spec, tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), p)
}

// Image returns the image described by spec (one layer, docker media types).
func Image(spec Spec) (v1.Image, error) {
	layerTar, err := layer(spec)
	if err != nil {
		return nil, err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer: l,
		History: v1.History{
			Created:   v1.Time{Time: Epoch},
			CreatedBy: "ipledger internal/image",
			Comment:   fmt.Sprintf("%d files", len(spec.Files)),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("image: append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture = spec.Arch
	if cf.Architecture == "" {
		cf.Architecture = runtime.GOARCH
	}
	cf.OS = "linux"
	cf.Created = v1.Time{Time: Epoch}
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.Cmd = spec.Cmd
	cf.Config.Env = spec.Env
	cf.Config.WorkingDir = spec.WorkingDir
	if cf.Config.WorkingDir == "" {
		cf.Config.WorkingDir = "/"
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image: config: %w", err)
	}
	return img, nil
}

// layer returns the layer's uncompressed tar: directories first (sorted), then
// files (sorted), every header with the epoch as its time and root as owner.
func layer(spec Spec) ([]byte, error) {
	dirs := map[string]int64{}
	addParents := func(p string) {
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := dirs[d]; !ok {
				dirs[d] = 0o755
			}
		}
	}
	for _, d := range spec.Dirs {
		d = strings.Trim(path.Clean("/"+d), "/")
		if d == "" {
			return nil, fmt.Errorf("%w: dir %q is the root", ErrBadSpec, d)
		}
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		dirs[d] = mode
		addParents(d)
	}
	files := map[string]File{}
	for _, f := range spec.Files {
		p := strings.Trim(path.Clean("/"+f.Path), "/")
		if p == "" {
			return nil, fmt.Errorf("%w: file path %q names the root; give a file name", ErrBadSpec, f.Path)
		}
		if _, dup := files[p]; dup {
			return nil, fmt.Errorf("%w: file %q given twice", ErrBadSpec, p)
		}
		if f.Mode == 0 {
			f.Mode = 0o644
		}
		files[p] = f
		addParents(p)
	}
	for p := range files {
		if _, clash := dirs[p]; clash {
			return nil, fmt.Errorf("%w: %q is both a file and a directory", ErrBadSpec, p)
		}
	}
	// sized once: grown by doubling, the buffer of a 150 MB layer cost more CPU
	// (fresh pages cleared) than the gzip after it
	size := 1024 + 2048*(len(dirs)+len(files))
	for _, f := range files {
		size += len(f.Data)
	}
	buf := bytes.NewBuffer(make([]byte, 0, size))
	tw := tar.NewWriter(buf)
	for _, d := range sortedKeys(dirs) {
		h := &tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: dirs[d], ModTime: Epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
	}
	for _, p := range sortedKeys(files) {
		f := files[p]
		h := &tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: f.Mode, Size: int64(len(f.Data)), ModTime: Epoch, Format: tar.FormatPAX}
		if f.Link != "" {
			if len(f.Data) > 0 {
				return nil, fmt.Errorf("%w: %q is a link to %q and has data too", ErrBadSpec, p, f.Link)
			}
			h = &tar.Header{Typeflag: tar.TypeSymlink, Name: p, Linkname: f.Link, Mode: 0o777, ModTime: Epoch, Format: tar.FormatPAX}
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// Binaries are what the ipledger image holds in BinDir: the four ipledger
// binaries and portmap, the standard CNI port-mapping plugin (built from
// go.mod's containernetworking/plugins), which install-cni puts beside them.
var Binaries = []string{"ipledger", "ipledger-veth", "ipledgerctl", "ipledgerd", "portmap"}

// BinDir is where the ipledger image holds its binaries (on PATH).
const BinDir = "/usr/local/bin"

// IpledgerSpec returns the spec of the ipledger image: the static Binaries
// from binDir (as `make build` writes them) in BinDir, ipledgerd as the
// entrypoint, and /var/run a link to /run.
func IpledgerSpec(binDir, tag string) (Spec, error) {
	spec := Spec{
		Tag:        tag,
		Dirs:       []string{"tmp", "etc", "run", "var/lib", "proc", "sys", "dev"},
		Entrypoint: []string{BinDir + "/ipledgerd"},
		Env:        []string{"PATH=" + BinDir + ":/usr/sbin:/usr/bin:/sbin:/bin"},
	}
	for _, b := range Binaries {
		data, err := os.ReadFile(filepath.Join(binDir, b))
		if err != nil {
			return Spec{}, fmt.Errorf("image: %w (run make build first)", err)
		}
		spec.Files = append(spec.Files, File{Path: BinDir + "/" + b, Mode: 0o755, Data: data})
	}
	// /var/run is /run, as on the hosts: containerd records pods' namespaces as
	// /var/run/netns/..., and the agent, which mounts the host's /run/netns, must
	// resolve those paths to see them.
	spec.Files = append(spec.Files, File{Path: "var/run", Link: "../run"})
	return spec, nil
}
