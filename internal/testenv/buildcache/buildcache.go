// Package buildcache builds an external Go program once per machine and keeps
// it: the test environments' Kubernetes binaries, etcd, flanneld, CoreDNS and
// containerd are each a Recipe (what to build, where, from what) and Ensure
// does the rest the same way for all of them:
//
//   - the cache directory Dir holds bin/ (the outputs and .stamp) and src/ (the
//     small module the build runs in);
//   - bin/ is valid while .stamp holds the recipe's key (a digest of what the
//     build depends on: module versions, flags, the Go toolchain) and every
//     output is there and not empty: a warm run builds nothing;
//   - a build takes an exclusive flock (Dir/.lock, or a lock shared by
//     several recipes), so concurrent test processes wait for one build
//     instead of racing it, and look again once they hold the lock;
//   - outputs are written to bin.tmp/, the stamp last, and bin.tmp/ renamed to
//     bin/: a build that fails or is killed leaves no stamp, so the next run
//     builds again instead of trusting half a directory;
//   - a cold build says what it builds and about how long it takes, then a
//     line a minute while it runs, so a first `make test` does not look hung.
package buildcache

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// DefaultRoot is where the caches live unless IPLEDGER_KUBE_CACHE says
// otherwise.
const DefaultRoot = "/var/cache/ipledger"

// Root is the directory the recipes' cache directories are under: the parent
// of $IPLEDGER_KUBE_CACHE when set (its kube/ sibling directories), else
// DefaultRoot.
func Root() string {
	if k := os.Getenv("IPLEDGER_KUBE_CACHE"); k != "" {
		return filepath.Dir(filepath.Clean(k))
	}
	return DefaultRoot
}

// Toolchain is the Go toolchain a build uses, for recipes' keys.
func Toolchain() string { return runtime.Version() }

// Recipe is one cached build.
type Recipe struct {
	// Name and Version name the build in its progress lines ("containerd",
	// "v2.3.7").
	Name, Version string
	// Dir is the recipe's cache directory: Dir/bin holds the Outputs and
	// .stamp, Dir/src the build module (Build's src).
	Dir string
	// LockFile is the lock the build takes; empty: Dir/.lock.
	LockFile string
	// Key lists what the outputs depend on (module versions, flags, the
	// toolchain); the stamp is a digest of the parts joined with NUL bytes.
	Key []string
	// Outputs are the files Build writes into its out directory.
	Outputs []string
	// Cold is about how long a cold build takes on this project's machines (2
	// cores), said in the progress line; zero: unknown.
	Cold time.Duration
	// Build writes every one of Outputs into out. src is the directory
	// Dir/src, created and otherwise left as a previous build left it (a
	// module there keeps its go.sum).
	Build func(src, out string) error
}

// Stamp is the content of bin/.stamp for r: the first 16 hex digits of the
// SHA-256 of Key joined with NUL bytes.
func (r Recipe) Stamp() string {
	h := sha256.Sum256([]byte(strings.Join(r.Key, "\x00")))
	return hex.EncodeToString(h[:])[:16]
}

// BinDir is the directory holding r's outputs once built.
func (r Recipe) BinDir() string { return filepath.Join(r.Dir, "bin") }

// Path is the path of output name in BinDir.
func (r Recipe) Path(name string) string { return filepath.Join(r.BinDir(), name) }

// Cached reports whether BinDir holds r's outputs: the stamp matches and no
// output is missing or empty.
func (r Recipe) Cached() bool {
	b, err := os.ReadFile(filepath.Join(r.BinDir(), ".stamp"))
	if err != nil || strings.TrimSpace(string(b)) != r.Stamp() {
		return false
	}
	for _, o := range r.Outputs {
		if fi, err := os.Stat(r.Path(o)); err != nil || fi.Size() == 0 {
			return false
		}
	}
	return true
}

func (r Recipe) check() error {
	switch {
	case r.Name == "":
		return fmt.Errorf("buildcache: recipe without Name: %w", ErrRecipe)
	case r.Dir == "":
		return fmt.Errorf("buildcache: recipe %s without Dir: %w", r.Name, ErrRecipe)
	case len(r.Key) == 0:
		return fmt.Errorf("buildcache: recipe %s without Key: %w", r.Name, ErrRecipe)
	case len(r.Outputs) == 0:
		return fmt.Errorf("buildcache: recipe %s without Outputs: %w", r.Name, ErrRecipe)
	case r.Build == nil:
		return fmt.Errorf("buildcache: recipe %s without Build: %w", r.Name, ErrRecipe)
	}
	return nil
}

// Logf receives Ensure's progress lines (a test's tb.Logf; nil: none).
type Logf func(format string, args ...any)

// Ensure returns r's BinDir, building r first unless it is cached. The build
// runs under r's lock; a process that waited for the lock looks at the cache
// again before building. Progress lines go to logf and, when the process has
// a terminal, to it (go test holds a package's output until the package ends).
func Ensure(r Recipe, logf Logf) (string, error) {
	if err := r.check(); err != nil {
		return "", err
	}
	if r.Cached() {
		return r.BinDir(), nil
	}
	if err := os.MkdirAll(r.Dir, 0o755); err != nil {
		return "", err
	}
	lockPath := r.LockFile
	if lockPath == "" {
		lockPath = filepath.Join(r.Dir, ".lock")
	}
	unlock, err := lock(lockPath)
	if err != nil {
		return "", err
	}
	defer unlock()
	if r.Cached() {
		return r.BinDir(), nil
	}
	say, closeTTY := progress(logf)
	defer closeTTY()
	t0, cpu0 := time.Now(), childCPU()
	say("buildcache: building %s %s (%s) into %s ...", r.Name, r.Version, coldText(r.Cold), r.BinDir())
	stop := ticker(say, r, t0)
	err = build(r)
	stop()
	if err != nil {
		say("buildcache: building %s %s failed after %v", r.Name, r.Version, time.Since(t0).Round(time.Second))
		return "", err
	}
	say("buildcache: built %s %s in %v (%v of CPU in the go commands)", r.Name, r.Version, time.Since(t0).Round(time.Second), (childCPU() - cpu0).Round(time.Second))
	if !r.Cached() {
		return "", fmt.Errorf("buildcache: %s %s built but %s does not validate: %w", r.Name, r.Version, r.BinDir(), ErrIncomplete)
	}
	return r.BinDir(), nil
}

// build runs r.Build into bin.tmp, stamps it and renames it to bin. On any
// error bin.tmp is removed and bin left as it was.
func build(r Recipe) (err error) {
	src := filepath.Join(r.Dir, "src")
	tmp := filepath.Join(r.Dir, "bin.tmp")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return err
	}
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err := r.Build(src, tmp); err != nil {
		return err
	}
	for _, o := range r.Outputs {
		if fi, err := os.Stat(filepath.Join(tmp, o)); err != nil || fi.Size() == 0 {
			return fmt.Errorf("buildcache: %s %s: the build wrote no %s: %w", r.Name, r.Version, o, ErrIncomplete)
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, ".stamp"), []byte(r.Stamp()+"\n"), 0o644); err != nil {
		return err
	}
	if err := os.RemoveAll(r.BinDir()); err != nil {
		return err
	}
	return os.Rename(tmp, r.BinDir())
}

func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("buildcache: lock %s: %w", path, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

func coldText(d time.Duration) string {
	if d <= 0 {
		return "cold"
	}
	if d < time.Minute {
		return fmt.Sprintf("cold, about %v on 2 cores", d.Round(time.Second))
	}
	return fmt.Sprintf("cold, about %d min on 2 cores", int((d+30*time.Second)/time.Minute))
}

// progress writes each line to logf and to the terminal, if any, until
// closeTTY.
func progress(logf Logf) (say Logf, closeTTY func()) {
	tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0)
	if err != nil {
		tty = nil
	}
	say = func(format string, args ...any) {
		if logf != nil {
			logf(format, args...)
		}
		if tty != nil {
			fmt.Fprintf(tty, format+"\n", args...)
		}
	}
	return say, func() {
		if tty != nil {
			tty.Close()
		}
	}
}

// tickEvery is how often a running build says it still runs.
var tickEvery = time.Minute

// ticker says every tickEvery that r's build still runs, until stop returns.
func ticker(say Logf, r Recipe, t0 time.Time) (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(tickEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				say("buildcache: still building %s %s: %v so far (%s)", r.Name, r.Version, time.Since(t0).Round(time.Second), coldText(r.Cold))
			}
		}
	}()
	return func() { close(done); <-exited }
}

// childCPU is the user and system time of this process's waited-for
// children: the go commands and, through them, the compilers and linker.
func childCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// goBin is the go command: from PATH, else where this project's machines
// have it.
func goBin() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// GoEnv is the environment every build's go command runs with: no cgo (env
// may turn it on), modules resolved by the build module, no workspace, the
// local toolchain.
var GoEnv = []string{"CGO_ENABLED=0", "GOFLAGS=-mod=mod -buildvcs=false", "GOWORK=off", "GOTOOLCHAIN=local"}

// Go runs `go args...` in dir with GoEnv, then env, and returns its standard
// output; an error carries the tail of its standard error.
func Go(dir string, env []string, args ...string) ([]byte, error) {
	cmd := exec.Command(goBin(), args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), GoEnv...), env...)
	// A test that times out or is killed takes its build with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("buildcache: go %s (in %s): %v\n%s", strings.Join(args, " "), dir, err, tail(stderr.String(), 40))
	}
	return out, nil
}

// ModFile is the go.mod of a build module named ipledger.test/NAME (go
// 1.26.0), followed by body (require and replace lines), if any.
func ModFile(name, body string) string {
	mod := fmt.Sprintf("module ipledger.test/%s\n\ngo 1.26.0\n", name)
	if body != "" {
		mod += "\n" + body
	}
	return mod
}

// WriteModule writes a build module into src: modFile as go.mod (see
// ModFile) and a doc.go, so that `go get` and `go build` of other modules'
// commands run in it.
func WriteModule(src, modFile string) error {
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte(modFile), 0o644); err != nil {
		return err
	}
	doc := "// Package build only pins the modules a cached build is made from.\npackage build\n"
	return os.WriteFile(filepath.Join(src, "doc.go"), []byte(doc), 0o644)
}

// CopyModule downloads module@version (through a scratch module in work) and
// copies its source, writable, to dst (removed first): a program built as the
// main module of its own source keeps its own go.mod, go.sum and replaces.
func CopyModule(work, module, version, dst string) error {
	dl := filepath.Join(work, "dl")
	if err := os.MkdirAll(dl, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dl, "go.mod"), []byte("module ipledger.test/dl\n\ngo 1.26.0\n"), 0o644); err != nil {
		return err
	}
	out, err := Go(dl, nil, "mod", "download", "-json", module+"@"+version)
	if err != nil {
		return err
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return fmt.Errorf("buildcache: go mod download %s@%s: %v %s", module, version, err, mod.Error)
	}
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	if out, err := exec.Command("cp", "-r", mod.Dir, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("buildcache: copy %s: %v: %s", mod.Dir, err, out)
	}
	if out, err := exec.Command("chmod", "-R", "u+w", dst).CombinedOutput(); err != nil {
		return fmt.Errorf("buildcache: chmod %s: %v: %s", dst, err, out)
	}
	return nil
}

// ModuleDir is the directory of module in the module cache as the build
// module in src resolves it.
func ModuleDir(src, module string) (string, error) {
	out, err := Go(src, nil, "list", "-m", "-f", "{{.Dir}}", module)
	if err != nil {
		return "", err
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("buildcache: go list -m %s in %s: no directory: %w", module, src, ErrIncomplete)
	}
	return dir, nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
