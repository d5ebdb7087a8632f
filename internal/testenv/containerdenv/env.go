// Package containerdenv starts a real, private containerd (CRI plugin, runc,
// CNI) for tests and benchmarks: its own root, state and socket under a short
// directory in /tmp, a locally built pause image (no registry needed), and
// cleanup by PID.
//
// Typical use:
//
//	env := containerdenv.Start(t, containerdenv.Options{Conflist: conflist})
//	c := env.Client(t)
//	id, err := c.RunPodSandbox(ctx, cri.PodSpec{Namespace: "default", Name: "p", UID: "u1"})
package containerdenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/testenv"
)

// DefaultCNIBinDir is where Debian's containernetworking-plugins live.
const DefaultCNIBinDir = "/usr/lib/cni"

// Options configures an Env. The zero value is usable.
type Options struct {
	// CNIConfDir is the CNI configuration directory containerd reads
	// (containerd 1.6 uses the conflist with the lowest file name; max_conf_num
	// is 1). Empty: a fresh directory inside the env, removed at cleanup.
	CNIConfDir string
	// Conflist, when set, is written to CNIConfDir as 10-test.conflist before
	// containerd starts.
	Conflist string
	// CNIBinDirs are searched for plugins in order. DefaultCNIBinDir is always
	// appended last (containerd needs its loopback plugin). containerd 1.6
	// takes one bin_dir only, so several dirs are merged into a directory of
	// symlinks, refreshed at Restart.
	CNIBinDirs []string
	// CNIBinDir, when set, is given to containerd as its one plugin directory,
	// as is: the caller fills it (e.g. a CNI installer under test) and it must
	// hold loopback. CNIBinDirs is then ignored.
	CNIBinDir string
	// Snapshotter: "" picks overlayfs when an overlay mount works here, else
	// native.
	Snapshotter string
	// StartTimeout bounds the wait for containerd's CRI service (default 30s).
	StartTimeout time.Duration
	// CallTimeout is the per-call timeout of clients from Client (default 30s).
	CallTimeout time.Duration
	// LogLevel of containerd (default "info").
	LogLevel string
	// Version is the containerd to run: a key of Versions (built from its
	// Go module, cached) or Debian. Empty: what VersionEnv selects.
	Version string
}

// Env is one private containerd. Methods are safe for concurrent use.
type Env struct {
	tb   testing.TB
	opts Options

	base, root, state, runcRoot string
	sock, cfgPath, logPath      string
	confDir, binDir             string
	snapshotter, image          string
	version                     string
	major                       int
	ctdBin                      string // the directory of containerd, its shim and ctr

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
}

// SkipIfShort skips tb under -short as Start does: for a harness that starts
// containerd late in a run, so that it skips before the work that comes first.
func SkipIfShort(tb testing.TB) {
	tb.Helper()
	testenv.SkipIfShort(tb, "needs containerd")
}

// Start installs containerd, runc and the CNI plugins if missing, builds and
// imports the pause image, starts containerd and waits until its CRI service
// answers. Everything is undone by tb.Cleanup: sandboxes are stopped and
// removed, containerd is stopped by PID, mounts under its dirs are detached
// and the dirs removed. Under -short it skips tb.
func Start(tb testing.TB, opts Options) *Env {
	tb.Helper()
	SkipIfShort(tb)
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 30 * time.Second
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 30 * time.Second
	}
	if opts.LogLevel == "" {
		opts.LogLevel = "info"
	}
	if err := ensureDeps(); err != nil {
		tb.Fatal(err)
	}
	version := opts.Version
	if version == "" {
		v, err := Selected()
		if err != nil {
			tb.Fatal(err)
		}
		version = v
	}
	ctdBin, err := Binaries(version, tb.Logf)
	if err != nil {
		tb.Fatal(err)
	}
	major := Major(version)
	image, tarPath, err := pauseImage()
	if err != nil {
		tb.Fatal(err)
	}
	// Short base: the socket path must fit in 108 bytes.
	base, err := os.MkdirTemp("/tmp", "ctd")
	if err != nil {
		tb.Fatal(err)
	}
	e := &Env{
		tb: tb, opts: opts, base: base, image: image,
		version: version, major: major, ctdBin: ctdBin,
		root:     filepath.Join(base, "root"),
		state:    filepath.Join(base, "state"),
		runcRoot: filepath.Join(base, "state", "runc"),
		sock:     filepath.Join(base, "c.sock"),
		cfgPath:  filepath.Join(base, "config.toml"),
		logPath:  filepath.Join(base, "containerd.log"),
		confDir:  opts.CNIConfDir,
	}
	tb.Cleanup(e.cleanup)
	if e.confDir == "" {
		e.confDir = filepath.Join(base, "net.d")
	}
	if err := os.MkdirAll(e.confDir, 0o755); err != nil {
		tb.Fatal(err)
	}
	if opts.Conflist != "" {
		if err := os.WriteFile(filepath.Join(e.confDir, "10-test.conflist"), []byte(opts.Conflist), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	if err := e.setupBinDir(); err != nil {
		tb.Fatal(err)
	}
	e.snapshotter = opts.Snapshotter
	if e.snapshotter == "" {
		e.snapshotter = "native"
		if overlayWorks(base) {
			e.snapshotter = "overlayfs"
		}
	}
	if err := os.WriteFile(e.cfgPath, []byte(e.config()), 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := e.start(); err != nil {
		e.logTail()
		tb.Fatal(err)
	}
	if err := e.importImage(tarPath); err != nil {
		e.logTail()
		tb.Fatal(err)
	}
	return e
}

// Version is the containerd the env runs: a key of Versions, or Debian.
func (e *Env) Version() string { return e.version }

// Endpoint returns the CRI endpoint, "unix:///tmp/ctd…/c.sock".
func (e *Env) Endpoint() string { return "unix://" + e.sock }

// CNIConfDir returns the CNI configuration directory containerd reads.
func (e *Env) CNIConfDir() string { return e.confDir }

// CNIBinDir returns the single plugin directory containerd was given.
func (e *Env) CNIBinDir() string { return e.binDir }

// StateDir returns containerd's state directory (netns mounts live under it).
func (e *Env) StateDir() string { return e.state }

// RootDir returns containerd's root directory.
func (e *Env) RootDir() string { return e.root }

// PID returns the PID of the running containerd, 0 when it is not running.
func (e *Env) PID() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.runningLocked() {
		return 0
	}
	return e.cmd.Process.Pid
}

// Client dials the env's CRI endpoint; the client is closed at tb's cleanup.
func (e *Env) Client(tb testing.TB) *cri.Client {
	tb.Helper()
	c, err := cri.Dial(context.Background(), e.Endpoint(), e.opts.CallTimeout)
	if err != nil {
		e.logTail()
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// ShimPIDs returns the live runc shims serving this env's containerd (its socket,
// unique to the env, on their command lines).
func (e *Env) ShimPIDs() []int { return pidsWithArgs("-address " + e.sock + " ") }

// Kill sends SIGKILL to containerd and waits for it to exit. Shims and
// sandboxes keep running, as after a containerd crash.
func (e *Env) Kill() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.runningLocked() {
		return
	}
	_ = e.cmd.Process.Signal(syscall.SIGKILL)
	<-e.done
}

// Stop sends SIGTERM to containerd and waits for it to exit (SIGKILL after
// 15 s). It returns containerd's exit error, if any.
func (e *Env) Stop() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.runningLocked() {
		return nil
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
		return e.waitErr
	case <-time.After(15 * time.Second):
		_ = e.cmd.Process.Signal(syscall.SIGKILL)
		<-e.done
		return fmt.Errorf("containerdenv: containerd (pid %d) ignored SIGTERM for 15s, killed", e.cmd.Process.Pid)
	}
}

// Restart stops containerd if it runs and starts it again with the same
// directories, waiting until its CRI service answers.
func (e *Env) Restart(tb testing.TB) {
	tb.Helper()
	if err := e.Stop(); err != nil {
		tb.Log(err)
	}
	if err := e.setupBinDir(); err != nil {
		tb.Fatal(err)
	}
	if err := e.start(); err != nil {
		e.logTail()
		tb.Fatal(err)
	}
}

// WipeState simulates a reboot: containerd is killed, the sandboxes' shims
// and pause processes are killed by the PIDs recorded in the state dir, every
// mount under the env (netns, shm, rootfs) is detached and the state dir
// (including runc's) is removed. The root dir (metadata, images, snapshots)
// stays. Call Restart to boot again.
func (e *Env) WipeState(tb testing.TB) {
	tb.Helper()
	e.Kill()
	for _, d := range e.killTasks() {
		tb.Logf("containerdenv: wipe state: %s", d)
	}
	if err := unmountUnder(e.base); err != nil {
		tb.Fatalf("containerdenv: wipe state: %v", err)
	}
	if err := os.RemoveAll(e.state); err != nil {
		tb.Fatalf("containerdenv: wipe state: %v", err)
	}
}

func (e *Env) runningLocked() bool {
	if e.cmd == nil {
		return false
	}
	select {
	case <-e.done:
		return false
	default:
		return true
	}
}

// start launches containerd and waits for the CRI service to answer.
func (e *Env) start() error {
	e.mu.Lock()
	if e.runningLocked() {
		e.mu.Unlock()
		return nil
	}
	logf, err := os.OpenFile(e.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		e.mu.Unlock()
		return err
	}
	fmt.Fprintf(logf, "---- containerdenv: start %s\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(filepath.Join(e.ctdBin, "containerd"), "--config", e.cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The shim is looked up on PATH: this version's first, then Debian's runc.
	cmd.Env = append(os.Environ(), "PATH="+SearchPath(e.ctdBin)+":"+os.Getenv("PATH"))
	// Own process group (a ^C to the test does not hit it first); killed if
	// the test process dies without cleanup (see spawn for the thread).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := spawn(cmd); err != nil {
		logf.Close()
		e.mu.Unlock()
		return fmt.Errorf("containerdenv: start containerd: %w", err)
	}
	done := make(chan struct{})
	e.cmd, e.done = cmd, done
	go func() {
		err := cmd.Wait()
		logf.Close()
		// Read only after <-done; no lock (Stop waits on done holding e.mu).
		e.waitErr = err
		close(done)
	}()
	e.mu.Unlock()
	return e.waitReady(done)
}

// waitReady waits (bounded) until the socket exists and CRI answers Version.
func (e *Env) waitReady(done chan struct{}) error {
	deadline := time.Now().Add(e.opts.StartTimeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-done:
			err := e.waitErr
			return fmt.Errorf("containerdenv: containerd exited during start: %v", err)
		default:
		}
		if _, err := os.Stat(e.sock); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			c, err := cri.Dial(ctx, e.Endpoint(), 2*time.Second)
			cancel()
			if err == nil {
				c.Close()
				return nil
			}
			last = err
		} else {
			last = err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("containerdenv: CRI at %s not ready after %v: %v", e.Endpoint(), e.opts.StartTimeout, last)
}

// ImportImage imports a docker-archive into the k8s.io namespace (the
// CRI's) with the env's own ctr and snapshotter.
func (e *Env) ImportImage(tarPath string) error { return e.importImage(tarPath) }

// importImage imports an image archive into the k8s.io namespace.
func (e *Env) importImage(tarPath string) error {
	cmd := exec.Command(filepath.Join(e.ctdBin, "ctr"), "--address", e.sock, "-n", "k8s.io", "images", "import",
		"--snapshotter", e.snapshotter, tarPath)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("containerdenv: ctr images import %s: %v\n%s", tarPath, err, out)
	}
	return nil
}

// setupBinDir gives containerd one plugin directory: the single configured
// dir, or a directory of symlinks merging several (first wins).
func (e *Env) setupBinDir() error {
	if e.opts.CNIBinDir != "" {
		e.binDir = e.opts.CNIBinDir
		return nil
	}
	dirs := append([]string(nil), e.opts.CNIBinDirs...)
	has := false
	for _, d := range dirs {
		if filepath.Clean(d) == DefaultCNIBinDir {
			has = true
		}
	}
	if !has {
		dirs = append(dirs, DefaultCNIBinDir)
	}
	if len(dirs) == 1 {
		e.binDir = dirs[0]
		return nil
	}
	e.binDir = filepath.Join(e.base, "cnibin")
	if err := os.RemoveAll(e.binDir); err != nil {
		return err
	}
	if err := os.MkdirAll(e.binDir, 0o755); err != nil {
		return err
	}
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return err
		}
		for _, ent := range ents {
			if ent.IsDir() {
				continue
			}
			abs, err := filepath.Abs(filepath.Join(d, ent.Name()))
			if err != nil {
				return err
			}
			if err := os.Symlink(abs, filepath.Join(e.binDir, ent.Name())); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
		}
	}
	return nil
}

// config renders containerd's config.toml for the env's version.
func (e *Env) config() string {
	return Config{
		Root: e.root, State: e.state, Socket: e.sock, Sandbox: e.image, Snapshotter: e.snapshotter,
		RuncRoot: e.runcRoot, CNIBinDir: e.binDir, CNIConfDir: e.confDir,
		// netns bind mounts under our state dir, not /var/run/netns.
		NetnsUnderState: true, LogLevel: e.opts.LogLevel,
	}.Render(e.major)
}

// killTasks kills every sandbox process (by the init.pid in its bundle,
// verified to be /pause) and shim (the process working in the bundle dir and
// naming our socket) of this containerd, then removes the shims' sockets and the
// tasks' cgroups, as a reboot would. It returns what it did, for the log.
func (e *Env) killTasks() []string {
	var did []string
	bundles, _ := filepath.Glob(filepath.Join(e.state, "io.containerd.runtime.v2.task", "*", "*"))
	for _, b := range bundles {
		id := filepath.Base(b)
		if pid := readPID(filepath.Join(b, "init.pid")); pid > 0 && strings.HasPrefix(cmdline(pid), "/pause") {
			killPID(pid)
			did = append(did, fmt.Sprintf("killed pause pid %d of %.12s", pid, id))
		}
		// The runc v2 shim leaves no PID file; it runs with the bundle as its
		// working directory and names our socket on its command line.
		for _, pid := range pidsWithCwd(b) {
			if strings.Contains(cmdline(pid), "-address "+e.sock+" ") {
				killPID(pid)
				did = append(did, fmt.Sprintf("killed shim pid %d of %.12s", pid, id))
			}
		}
		if addr, err := os.ReadFile(filepath.Join(b, "address")); err == nil {
			p := strings.TrimPrefix(strings.TrimSpace(string(addr)), "unix://")
			if strings.HasPrefix(p, "/run/containerd/s/") {
				_ = os.Remove(p)
			}
		}
		if cg := cgroupsPath(filepath.Join(b, "config.json")); cg != "" {
			removeCgroup(cg)
		}
	}
	// A shim whose bundle containerd had renamed to ".ID" to delete it, when
	// containerd was killed mid-delete (the demo's and the seed tests' kill -9), is
	// under no bundle above and outlives every containerd of this env: found by our
	// socket, unique to this env, on its command line, with its /pause if it has one
	// (and the pause's cgroup, which no bundle's config.json names any more).
	for _, pid := range e.ShimPIDs() {
		for _, c := range childrenOf(pid) {
			if strings.HasPrefix(cmdline(c), "/pause") {
				cg := cgroupOf(c)
				killPID(c)
				if cg != "" {
					removeCgroup(cg)
				}
				did = append(did, fmt.Sprintf("killed pause pid %d of an orphaned shim", c))
			}
		}
		killPID(pid)
		did = append(did, fmt.Sprintf("killed orphaned shim pid %d", pid))
	}
	return did
}

// cleanup tears everything down; registered by Start.
func (e *Env) cleanup() {
	tb := e.tb
	if _, err := os.Stat(e.cfgPath); err == nil {
		e.mu.Lock()
		running := e.runningLocked()
		e.mu.Unlock()
		if !running {
			// Bring it back to tear the sandboxes down properly (CNI DEL).
			if err := e.start(); err != nil {
				tb.Logf("containerdenv cleanup: %v", err)
			}
		}
		e.RemoveSandboxes()
		if err := e.Stop(); err != nil {
			tb.Logf("containerdenv cleanup: stop: %v", err)
		}
	}
	e.Kill()
	e.killTasks()
	if tb.Failed() {
		e.logTail()
	}
	if err := unmountUnder(e.base); err != nil {
		tb.Logf("containerdenv cleanup: %v", err)
	}
	if err := os.RemoveAll(e.base); err != nil {
		tb.Logf("containerdenv cleanup: %v", err)
	}
}

// RemoveSandboxes stops and removes every sandbox the runtime lists (errors are
// logged: it runs in cleanups).
func (e *Env) RemoveSandboxes() {
	ctx := context.Background()
	c, err := cri.Dial(ctx, e.Endpoint(), e.opts.CallTimeout)
	if err != nil {
		e.tb.Logf("containerdenv cleanup: %v", err)
		return
	}
	defer c.Close()
	sbs, err := c.ListSandboxes(ctx)
	if err != nil {
		e.tb.Logf("containerdenv cleanup: %v", err)
		return
	}
	for _, s := range sbs {
		if err := c.StopPodSandbox(ctx, s.ID); err != nil && !errors.Is(err, cri.ErrNotFound) {
			e.tb.Logf("containerdenv cleanup: %v", err)
		}
		if err := c.RemovePodSandbox(ctx, s.ID); err != nil && !errors.Is(err, cri.ErrNotFound) {
			e.tb.Logf("containerdenv cleanup: %v", err)
		}
	}
}

// LogTail returns the last n lines of containerd's log.
func (e *Env) LogTail(n int) string {
	b, err := os.ReadFile(e.logPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (e *Env) logTail() {
	e.tb.Logf("containerd log (%s), last lines:\n%s", e.logPath, e.LogTail(60))
}
