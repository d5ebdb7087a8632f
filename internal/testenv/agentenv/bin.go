package agentenv

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/buildcache"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// Bin builds ipledger, ipledger-veth, ipledgerd, ipledgerctl, kubectl-ipledger
// and portmap and returns the directory holding them, laid out as `make build`'s
// bin/. It is also a CNI_PATH directory for the plugins.
//
// The build is cached (buildcache) per checkout, keyed by the content of every
// file of this module the binaries are built from (go list -deps: Go and
// embedded files) and the versions of the other modules: the test processes of
// one `go test ./...` share one build (the others wait for its lock), and a
// later run with the same source builds nothing. Once per test process the key
// is computed again (a go list, about a second).
func Bin(tb testing.TB) string {
	tb.Helper()
	dir, err := bin(tb.Logf)
	if err != nil {
		tb.Fatal(err)
	}
	return dir
}

// BinDir is Bin for a TestMain, before any test runs: the same cached build,
// its progress lines on stderr.
func BinDir() (string, error) {
	return bin(func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) })
}

func bin(logf func(string, ...any)) (string, error) {
	buildOnce.Do(func() {
		var r buildcache.Recipe
		if r, buildErr = binRecipe(); buildErr != nil {
			return
		}
		binDir, buildErr = buildcache.Ensure(r, logf)
	})
	return binDir, buildErr
}

// binRecipe is Bin's build: its cache directory is this checkout's (a digest of
// RepoRoot), its key the sources' (sourceKey).
func binRecipe() (buildcache.Recipe, error) {
	root := RepoRoot()
	key, outputs, err := sourceKey(root, "./cmd/...", PortmapPackage)
	if err != nil {
		return buildcache.Recipe{}, err
	}
	h := sha256.Sum256([]byte(root))
	return buildcache.Recipe{
		Name: "ipledger", Version: "(" + root + ")",
		Dir:     filepath.Join(buildcache.Root(), "ipledger-bin", hex.EncodeToString(h[:])[:12]),
		Key:     append([]string{buildcache.Toolchain(), "CGO_ENABLED=0", "-trimpath"}, key...),
		Outputs: outputs,
		Cold:    2 * time.Minute,
		Build: func(_, out string) error {
			cmd := exec.Command("go", "build", "-trimpath", "-o", out+"/", "./cmd/...", PortmapPackage)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if b, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("go build ./cmd/... %s: %v\n%s", PortmapPackage, err, b)
			}
			return nil
		},
	}, nil
}

// sourceKey lists what the packages pkgs (patterns, run in the module at root)
// are built from: for each package of this module they import, its Go and
// embedded files with a digest of each; for every other package, its module's
// path and version. outputs are the names of the commands among them (the main
// packages of the module at root, and of other modules).
func sourceKey(root string, pkgs ...string) (key, outputs []string, err error) {
	const format = `{{if not .Standard}}{{if .Module}}{{if .Module.Main}}M {{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{range .EmbedFiles}} {{.}}{{end}}{{else}}D {{.Module.Path}}@{{.Module.Version}}{{end}}{{end}}{{end}}{{if and (eq .Name "main") (not .DepOnly)}}
O {{.ImportPath}}{{end}}`
	cmd := exec.Command("go", append([]string{"list", "-deps", "-f", format}, pkgs...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, nil, fmt.Errorf("go list -deps %s: %v\n%s", strings.Join(pkgs, " "), err, stderr.String())
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || seen[line] {
			continue
		}
		seen[line] = true
		switch f[0] {
		case "D":
			key = append(key, f[1])
		case "O":
			outputs = append(outputs, filepath.Base(f[1]))
		case "M":
			dir := f[1]
			for _, name := range f[2:] {
				d, err := fileDigest(filepath.Join(dir, name))
				if err != nil {
					return nil, nil, err
				}
				rel, _ := filepath.Rel(root, filepath.Join(dir, name))
				key = append(key, rel+" "+d)
			}
		}
	}
	sort.Strings(key)
	if len(outputs) == 0 {
		return nil, nil, fmt.Errorf("go list -deps %s: no command found in %s", strings.Join(pkgs, " "), root)
	}
	return key, outputs, nil
}

// fileDigest is the SHA-256 of the file at p, in hex.
func fileDigest(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
