package containerdenv

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/buildcache"
)

// VersionEnv names the environment variable choosing the containerd the envs
// run: one of Versions' names, or Debian for the distribution's package.
const VersionEnv = "IPLEDGER_CONTAINERD"

// Debian is the containerd Debian 12 ships (1.6.20, end of life on
// 2025-08-23), run from /usr/bin as installed by apt.
const Debian = "debian"

// DefaultVersion is the containerd an env runs when VersionEnv is unset: the
// LTS release, which loads cniVersion 1.1.0 and calls STATUS.
const DefaultVersion = "2.3.7"

// Release is a containerd built from its Go module.
type Release struct {
	// Module and Version: the Go module and its tag.
	Module, Version string
	// Major is the configuration's shape: 1 (config version 2, the CRI
	// plugin "io.containerd.grpc.v1.cri") or 2 (config version 3, the CRI
	// plugins split into io.containerd.cri.v1.runtime/images).
	Major int
}

// Versions are the containerd releases an env can run, by VersionEnv value.
// 2.3 is the LTS (to 2028-04-30); 2.2.1 and 1.7.30 carry the teardown skip of
// containerd#10744 (seed 001), fixed in 2.2.2 and 1.7.31.
var Versions = map[string]Release{
	"2.3.7":  {Module: "github.com/containerd/containerd/v2", Version: "v2.3.7", Major: 2},
	"2.2.1":  {Module: "github.com/containerd/containerd/v2", Version: "v2.2.1", Major: 2},
	"1.7.30": {Module: "github.com/containerd/containerd", Version: "v1.7.30", Major: 1},
}

// Selected is the containerd version VersionEnv chooses (DefaultVersion when
// unset). An unknown value is an error naming the variable and the choices.
func Selected() (string, error) {
	v := strings.TrimPrefix(strings.TrimSpace(os.Getenv(VersionEnv)), "v")
	if v == "" {
		return DefaultVersion, nil
	}
	if _, ok := Versions[v]; ok || v == Debian {
		return v, nil
	}
	return "", fmt.Errorf("containerdenv: %s=%q: %w; choose one of %s", VersionEnv, v, ErrUnknownVersion, strings.Join(choices(), ", "))
}

func choices() []string {
	var out []string
	for v := range Versions {
		out = append(out, v)
	}
	sort.Strings(out)
	return append(out, Debian)
}

// binaries are the commands a containerd release is built into.
var binaries = []string{"containerd", "containerd-shim-runc-v2", "ctr"}

// tags are the build tags of containerd's own Makefile for a static build
// without cgo (the btrfs snapshotter, cgo-only, is left out).
const tags = "urfave_cli_no_docs osusergo netgo static_build"

func (r Release) ldflags() string {
	return fmt.Sprintf("-s -w -X %[1]s/version.Version=%[2]s -X %[1]s/version.Revision=module -X %[1]s/version.Package=%[1]s", r.Module, r.Version)
}

// recipe builds r's containerd, shim and ctr from the module's own source
// (its go.mod and go.sum as the main module), without cgo, into
// buildcache.Root()/containerd/VERSION.
func (r Release) recipe() buildcache.Recipe {
	return buildcache.Recipe{
		Name: "containerd", Version: r.Version,
		Dir:     filepath.Join(buildcache.Root(), "containerd", r.Version),
		Key:     []string{r.Module + "@" + r.Version, r.ldflags(), tags, strings.Join(binaries, ","), buildcache.Toolchain()},
		Outputs: binaries,
		Cold:    4 * time.Minute,
		Build: func(src, out string) error {
			if err := buildcache.CopyModule(filepath.Dir(src), r.Module, r.Version, src); err != nil {
				return err
			}
			for _, b := range binaries {
				t := tags
				if b == "containerd-shim-runc-v2" {
					t += " no_grpc"
				}
				if _, err := buildcache.Go(src, nil, "build", "-trimpath", "-tags", t, "-ldflags", r.ldflags(), "-o", filepath.Join(out, b), "./cmd/"+b); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

// Major is the configuration shape (Release.Major) of containerd version v:
// 1 for Debian's 1.6.20 and for a version this package does not know.
func Major(v string) int {
	if r, ok := Versions[v]; ok {
		return r.Major
	}
	return 1
}

// SearchPath is the PATH a containerd whose commands are in dir runs with:
// dir first (containerd finds its runc shim there), then the system's
// directories (Debian's runc).
func SearchPath(dir string) string {
	return dir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
}

// Binaries is where the commands of containerd version v live: /usr/bin for
// Debian's, else the build cache, building them first unless cached (a cold
// build of containerd, its shim and ctr takes a few minutes; logf gets the
// progress lines).
func Binaries(v string, logf buildcache.Logf) (string, error) {
	if v == Debian {
		return "/usr/bin", nil
	}
	r, ok := Versions[v]
	if !ok {
		return "", fmt.Errorf("containerdenv: containerd %q: %w; choose one of %s", v, ErrUnknownVersion, strings.Join(choices(), ", "))
	}
	return buildcache.Ensure(r.recipe(), logf)
}
