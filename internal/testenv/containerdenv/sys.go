package containerdenv

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/debpkg"
)

// ensureDeps installs containerd, runc, the CNI plugins and iproute2 when any is
// missing, under the machine-wide lock every test and scripts/install-deps.sh take
// (see debpkg): a concurrent test process is never caught half-way through apt.
func ensureDeps() error {
	return debpkg.Ensure(debpkg.Containerd, debpkg.Runc, debpkg.CNIPlugins, debpkg.IPRoute2)
}

// overlayWorks reports whether an overlay mount can be made under dir.
func overlayWorks(dir string) bool {
	p := filepath.Join(dir, "ovl")
	defer os.RemoveAll(p)
	var ds []string
	for _, d := range []string{"l", "u", "w", "m"} {
		ds = append(ds, filepath.Join(p, d))
		if err := os.MkdirAll(ds[len(ds)-1], 0o755); err != nil {
			return false
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", ds[0], ds[1], ds[2])
	if err := syscall.Mount("overlay", ds[3], "overlay", 0, opts); err != nil {
		return false
	}
	return syscall.Unmount(ds[3], syscall.MNT_DETACH) == nil
}

// mountsUnder lists mount points strictly under dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	prefix := filepath.Clean(dir) + "/"
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if strings.HasPrefix(mp, prefix) {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder detaches every mount under dir (netns bind mounts, sandbox
// shm, task rootfs), repeating for stacked mounts.
func unmountUnder(dir string) error {
	var errs []error
	for pass := 0; pass < 5; pass++ {
		mps, err := mountsUnder(dir)
		if err != nil {
			return err
		}
		if len(mps) == 0 {
			return nil
		}
		errs = errs[:0]
		for _, mp := range mps {
			if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("umount %s: %w", mp, err))
			}
		}
	}
	return errors.Join(errs...)
}

// readPID reads a pid file; 0 when absent or malformed.
func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0
	}
	return pid
}

func cmdline(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	return strings.ReplaceAll(string(b), "\x00", " ")
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	return s[i+2] != 'Z' && s[i+2] != 'X'
}

// killPID sends SIGKILL to pid and waits (bounded) until it is gone.
func killPID(pid int) {
	_ = syscall.Kill(pid, syscall.SIGKILL)
	deadline := time.Now().Add(3 * time.Second)
	for alive(pid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}

// cgroupsPath reads linux.cgroupsPath from an OCI bundle's config.json.
func cgroupsPath(configJSON string) string {
	b, err := os.ReadFile(configJSON)
	if err != nil {
		return ""
	}
	var spec struct {
		Linux struct {
			CgroupsPath string `json:"cgroupsPath"`
		} `json:"linux"`
	}
	if json.Unmarshal(b, &spec) != nil {
		return ""
	}
	p := spec.Linux.CgroupsPath
	// cgroupfs paths only ("/k8s.io/<id>"); never the root or a systemd slice spec.
	if !strings.HasPrefix(p, "/") || filepath.Clean(p) == "/" || strings.Contains(p, ":") {
		return ""
	}
	return filepath.Clean(p)
}

// removeCgroup removes the (empty) cgroup at path in every cgroup hierarchy.
func removeCgroup(path string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.Index(line, " - ")
		if i < 0 {
			continue
		}
		post := strings.Fields(line[i+3:])
		pre := strings.Fields(line[:i])
		if len(post) < 1 || len(pre) < 5 || (post[0] != "cgroup" && post[0] != "cgroup2") {
			continue
		}
		// Retry briefly: a just-killed task may still be leaving the cgroup.
		dir := filepath.Join(unescapeMount(pre[4]), path)
		for try := 0; try < 20; try++ {
			if err := syscall.Rmdir(dir); err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// cgroupOf returns pid's cgroup path below the hierarchies' roots, as a bundle's
// linux.cgroupsPath names it ("" when it is the root or cannot be read).
func cgroupOf(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.SplitN(line, ":", 3); len(f) == 3 && f[2] != "/" && f[2] != "" {
			return f[2]
		}
	}
	return ""
}

// pidsWithCwd returns the live processes whose working directory is dir.
func pidsWithCwd(dir string) []int {
	dir = filepath.Clean(dir)
	var out []int
	for _, pid := range pids() {
		cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		if err != nil {
			continue
		}
		cwd = strings.TrimSuffix(cwd, " (deleted)")
		if cwd == dir && alive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// pidsWithArgs returns the live processes whose command line (arguments joined by
// spaces, with a trailing one) contains args.
func pidsWithArgs(args string) []int {
	var out []int
	for _, pid := range pids() {
		if strings.Contains(cmdline(pid), args) && alive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// childrenOf returns the live processes whose parent is pid.
func childrenOf(pid int) []int {
	var out []int
	for _, c := range pids() {
		if ppid(c) == pid && alive(c) {
			out = append(out, c)
		}
	}
	return out
}

// pids lists the processes in /proc.
func pids() []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, ent := range ents {
		if pid, err := strconv.Atoi(ent.Name()); err == nil && pid > 1 {
			out = append(out, pid)
		}
	}
	return out
}

// ppid reads pid's parent from /proc/PID/stat (0 if it cannot): the field after the
// state, which follows the command name's closing parenthesis.
func ppid(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0
	}
	p, _ := strconv.Atoi(f[1])
	return p
}

type spawnReq struct {
	cmd *exec.Cmd
	err chan error
}

var (
	spawnOnce sync.Once
	spawnCh   chan spawnReq
)

// spawn starts cmd from one OS thread that lives as long as the process.
// Pdeathsig fires when the thread that forked the child exits, and Go ends
// threads whose goroutine exits while locked (netns code does that on
// purpose), so containerd must not be forked from an arbitrary thread.
func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread is ours for good
			for r := range spawnCh {
				r.err <- r.cmd.Start()
			}
		}()
	})
	r := spawnReq{cmd: cmd, err: make(chan error, 1)}
	spawnCh <- r
	return <-r.err
}
