// Package debpkg installs the Debian packages tests need, safely when several test
// processes (go test runs one per package, in parallel) and scripts/install-deps.sh
// want them at once.
//
// Every check and every installation holds an exclusive flock(2) on LockFile, the
// same lock scripts/install-deps.sh takes with flock(1). So a test never looks for a
// file while another process is half-way through installing its package (apt
// unpacks before it configures), and two processes never run apt-get at once (the
// second would fail on apt's own locks, or race its lists). A test that needs a
// package calls Need (or Ensure) before using it; the first caller installs what is
// missing, the others wait and then find it there.
package debpkg

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ipledger/ipledger/internal/testenv"
)

// LockFile serializes every package check and installation on the machine; also
// used by scripts/install-deps.sh.
const LockFile = "/run/lock/ipledger-deps.lock"

// lockWait bounds the wait for another process's installation.
const lockWait = 10 * time.Minute

// Package is a Debian package and the files whose presence shows it usable: an
// absolute path, or a command name looked up in PATH (so a runtime installed
// another way counts as well).
type Package struct {
	Name  string
	Files []string
}

// The packages the tests use.
var (
	IPRoute2   = Package{Name: "iproute2", Files: []string{"ip"}}
	CNIPlugins = Package{Name: "containernetworking-plugins", Files: []string{"/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback", "/usr/lib/cni/ptp", "/usr/lib/cni/portmap"}}
	IPTables   = Package{Name: "iptables", Files: []string{"iptables", "iptables-save", "ip6tables", "ip6tables-save"}}
	Containerd = Package{Name: "containerd", Files: []string{"containerd", "ctr", "containerd-shim-runc-v2"}}
	Runc       = Package{Name: "runc", Files: []string{"runc"}}
	Chromium   = Package{Name: "chromium", Files: []string{"chromium"}}
	BusyBox    = Package{Name: "busybox-static", Files: []string{"/bin/busybox"}}
	// The tools the e2e suite runs inside its agnhost image (internal/testenv/e2eenv).
	Curl    = Package{Name: "curl", Files: []string{"/usr/bin/curl"}}
	Netcat  = Package{Name: "netcat-openbsd", Files: []string{"/usr/bin/nc.openbsd"}}
	Dash    = Package{Name: "dash", Files: []string{"/usr/bin/dash"}}
	Bash    = Package{Name: "bash", Files: []string{"/usr/bin/bash"}}
	DNSUtil = Package{Name: "bind9-dnsutils", Files: []string{"/usr/bin/dig", "/usr/bin/nslookup"}}
	Wget    = Package{Name: "wget", Files: []string{"/usr/bin/wget"}}
)

// present reports whether every file of p exists.
func (p Package) present() bool {
	for _, f := range p.Files {
		var err error
		if filepath.IsAbs(f) {
			_, err = os.Stat(f)
		} else {
			_, err = exec.LookPath(f)
		}
		if err != nil {
			return false
		}
	}
	return true
}

var mu sync.Mutex // flock is per open file description; serialize this process's callers too

// Ensure installs with apt-get those of pkgs that are missing, holding LockFile. It
// returns an error naming the command to run by hand when it cannot.
func Ensure(pkgs ...Package) error {
	mu.Lock()
	defer mu.Unlock()
	unlock, err := lock()
	if err != nil {
		return err
	}
	defer unlock()
	missing := absent(pkgs)
	if len(missing) == 0 {
		return nil
	}
	manual := "apt-get update && apt-get install -y " + strings.Join(missing, " ")
	if os.Geteuid() != 0 {
		return fmt.Errorf("debpkg: packages %v are missing and installing them needs root: run as root: %s", missing, manual)
	}
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	for _, args := range [][]string{
		{"-o", "DPkg::Lock::Timeout=300", "update", "-qq"},
		append([]string{"-o", "DPkg::Lock::Timeout=300", "install", "-y", "-qq"}, missing...),
	} {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("debpkg: apt-get %s: %v\n%s\nto install by hand: %s", strings.Join(args, " "), err, out, manual)
		}
	}
	for _, p := range pkgs {
		if !p.present() {
			return fmt.Errorf("debpkg: package %s installed but %v still missing; check with: dpkg -L %s", p.Name, p.Files, p.Name)
		}
	}
	return nil
}

// Need is Ensure for tests: it fails tb when a package cannot be installed. Under
// -short it skips tb instead of installing what is missing.
func Need(tb testing.TB, pkgs ...Package) {
	tb.Helper()
	missing, err := check(pkgs)
	if err != nil {
		tb.Fatal(err)
	}
	if len(missing) > 0 {
		testenv.SkipIfShort(tb, "needs apt-get install "+strings.Join(missing, " "))
	}
	if err := Ensure(pkgs...); err != nil {
		tb.Fatal(err)
	}
}

// absent returns the names of those of pkgs that are not usable.
func absent(pkgs []Package) []string {
	var missing []string
	for _, p := range pkgs {
		if !p.present() {
			missing = append(missing, p.Name)
		}
	}
	return missing
}

// check is absent holding LockFile.
func check(pkgs []Package) ([]string, error) {
	mu.Lock()
	defer mu.Unlock()
	unlock, err := lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	return absent(pkgs), nil
}

// lock takes the exclusive machine-wide lock, waiting at most lockWait.
func lock() (func(), error) {
	if err := os.MkdirAll(filepath.Dir(LockFile), 0o755); err != nil {
		return nil, fmt.Errorf("debpkg: lock directory: %w", err)
	}
	f, err := os.OpenFile(LockFile, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("debpkg: open %s: %w", LockFile, err)
	}
	deadline := time.Now().Add(lockWait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("debpkg: flock %s: %w", LockFile, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("debpkg: %s held by another process for %v (a package installation?); see: fuser -v %s", LockFile, lockWait, LockFile)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
