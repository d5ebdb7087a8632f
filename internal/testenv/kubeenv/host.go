package kubeenv

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// The host state a kubelet changes, recorded before it starts and put back
// after everything stopped.

// kubeletSysctls are the sysctls kubelet sets at start (its "kernel
// defaults").
var kubeletSysctls = []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"}

var iptablesTables = []string{"filter", "nat", "mangle"}

type hostState struct {
	sysctls map[string]string
	// chains[binary/table] is the set of chains that existed before.
	chains map[string]map[string]bool
	// cgroups are the kubepods dirs that did not exist before.
	hadKubepods map[string]bool
	// logDirs the kubelet creates on the host whatever its root dir, and
	// whether each existed before.
	logDirs map[string]bool
}

var kubeletLogDirs = []string{"/var/log/containers", "/var/log/pods"}

func iptablesBins() []string {
	var bins []string
	for _, b := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(b); err == nil {
			bins = append(bins, b)
		}
	}
	return bins
}

func saveHost() (*hostState, error) {
	h := &hostState{sysctls: map[string]string{}, chains: map[string]map[string]bool{}, hadKubepods: map[string]bool{}}
	for _, s := range kubeletSysctls {
		b, err := os.ReadFile("/proc/sys/" + s)
		if err != nil {
			return nil, err
		}
		h.sysctls[s] = strings.TrimSpace(string(b))
	}
	for _, bin := range iptablesBins() {
		for _, t := range iptablesTables {
			rules, err := iptablesRules(bin, t)
			if err != nil {
				return nil, err
			}
			set := map[string]bool{}
			for _, r := range rules {
				if len(r) >= 2 && (r[0] == "-N" || r[0] == "-P") {
					set[r[1]] = true
				}
			}
			h.chains[bin+"/"+t] = set
		}
	}
	for _, d := range kubepodsDirs() {
		h.hadKubepods[d] = true
	}
	h.logDirs = map[string]bool{}
	for _, d := range kubeletLogDirs {
		_, err := os.Stat(d)
		h.logDirs[d] = err == nil
	}
	return h, nil
}

// restore undoes the kubelet's changes; it returns what it did and what failed.
// ours is the cluster's directory: the kubelet's symlinks into it (in
// /var/log/containers) are removed.
func (h *hostState) restore(ours string) (did []string, errs []error) {
	for s, v := range h.sysctls {
		cur, _ := os.ReadFile("/proc/sys/" + s)
		if strings.TrimSpace(string(cur)) == v {
			continue
		}
		if err := os.WriteFile("/proc/sys/"+s, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", s, v, err))
		} else {
			did = append(did, fmt.Sprintf("sysctl %s %s -> %s", s, strings.TrimSpace(string(cur)), v))
		}
	}
	for _, bin := range iptablesBins() {
		for _, t := range iptablesTables {
			d, e := h.removeNewChains(bin, t)
			did, errs = append(did, d...), append(errs, e...)
		}
	}
	for _, d := range kubepodsDirs() {
		if h.hadKubepods[d] {
			continue
		}
		if err := rmdirTree(d); err != nil {
			errs = append(errs, err)
		} else {
			did = append(did, "removed cgroup "+d)
		}
	}
	for d, existed := range h.logDirs {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			p := filepath.Join(d, e.Name())
			if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, ours+"/") {
				if err := os.Remove(p); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if existed {
			continue
		}
		// Only when empty: what is left in it is not ours to judge.
		if err := os.Remove(d); err == nil {
			did = append(did, "removed "+d)
		} else if !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s (created by the kubelet): %w", d, err))
		}
	}
	return did, errs
}

// removeNewChains deletes the rules that jump to chains created since
// saveHost, then flushes and deletes those chains. Chains and rules of others
// are left alone.
func (h *hostState) removeNewChains(bin, table string) (did []string, errs []error) {
	before := h.chains[bin+"/"+table]
	rules, err := iptablesRules(bin, table)
	if err != nil {
		return nil, []error{err}
	}
	var fresh []string
	for _, r := range rules {
		if len(r) >= 2 && r[0] == "-N" && !before[r[1]] {
			fresh = append(fresh, r[1])
		}
	}
	if len(fresh) == 0 {
		return nil, nil
	}
	isFresh := map[string]bool{}
	for _, c := range fresh {
		isFresh[c] = true
	}
	for _, r := range rules {
		if len(r) < 2 || r[0] != "-A" || isFresh[r[1]] {
			continue
		}
		for i := 0; i+1 < len(r); i++ {
			if (r[i] == "-j" || r[i] == "-g") && isFresh[r[i+1]] {
				args := append([]string{"-w", "5", "-t", table, "-D"}, r[1:]...)
				if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
					errs = append(errs, fmt.Errorf("%s %s: %v: %s", bin, strings.Join(args, " "), err, out))
				}
				break
			}
		}
	}
	for _, c := range fresh {
		if out, err := exec.Command(bin, "-w", "5", "-t", table, "-F", c).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("%s -t %s -F %s: %v: %s", bin, table, c, err, out))
		}
	}
	for _, c := range fresh {
		if out, err := exec.Command(bin, "-w", "5", "-t", table, "-X", c).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("%s -t %s -X %s: %v: %s", bin, table, c, err, out))
		} else {
			did = append(did, fmt.Sprintf("%s -t %s: removed chain %s", bin, table, c))
		}
	}
	return did, errs
}

// iptablesRules returns `iptables -t table -S`, each line split into words
// (double-quoted words kept whole, as -S prints comments).
func iptablesRules(bin, table string) ([][]string, error) {
	out, err := exec.Command(bin, "-w", "5", "-t", table, "-S").Output()
	if err != nil {
		return nil, fmt.Errorf("%s -t %s -S: %w", bin, table, err)
	}
	var rules [][]string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		rules = append(rules, splitWords(sc.Text()))
	}
	return rules, sc.Err()
}

func splitWords(line string) []string {
	var words []string
	var cur strings.Builder
	inWord, quoted, escaped := false, false, false
	for _, r := range line {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case r == '\\' && quoted:
			escaped = true
		case r == '"':
			quoted = !quoted
			inWord = true
		case r == ' ' && !quoted:
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// kubepodsDirs returns every hierarchy's kubepods cgroup that exists.
func kubepodsDirs() []string {
	var dirs []string
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range ents {
		d := filepath.Join("/sys/fs/cgroup", e.Name(), "kubepods")
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			dirs = append(dirs, d)
		}
	}
	if fi, err := os.Stat("/sys/fs/cgroup/kubepods"); err == nil && fi.IsDir() {
		dirs = append(dirs, "/sys/fs/cgroup/kubepods")
	}
	return dirs
}

// rmdirTree removes a cgroup directory tree, deepest first (cgroup dirs are
// removed with rmdir; their files go with them).
func rmdirTree(root string) error {
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	var errs []error
	for _, d := range dirs {
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("rmdir %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// unmountUnder detaches every mount point under dir, deepest first.
func unmountUnder(dir string) error {
	var errs []error
	for pass := 0; pass < 5; pass++ {
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			return err
		}
		var mps []string
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 5 {
				continue
			}
			mp := unescapeMount(f[4])
			if mp == dir || strings.HasPrefix(mp, dir+"/") {
				mps = append(mps, mp)
			}
		}
		if len(mps) == 0 {
			return nil
		}
		sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
		errs = errs[:0]
		for _, mp := range mps {
			if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("umount %s: %w", mp, err))
			}
		}
	}
	return errors.Join(errs...)
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}
