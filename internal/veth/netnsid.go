package veth

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// NSID identifies a network namespace by the device and inode of its nsfs file,
// which, unlike a /proc/PID/ns/net path, cannot be reused while the namespace lives.
type NSID struct {
	Dev uint64
	Ino uint64
}

func (n NSID) String() string { return fmt.Sprintf("%d:%d", n.Dev, n.Ino) }

// ParseNSID parses DEV:INO as written by String.
func ParseNSID(s string) (NSID, error) {
	d, i, ok := strings.Cut(s, ":")
	if !ok {
		return NSID{}, fmt.Errorf("%w: bad namespace identity %q", ErrNotNetNS, s)
	}
	dev, err1 := strconv.ParseUint(d, 10, 64)
	ino, err2 := strconv.ParseUint(i, 10, 64)
	if err1 != nil || err2 != nil {
		return NSID{}, fmt.Errorf("%w: bad namespace identity %q", ErrNotNetNS, s)
	}
	return NSID{Dev: dev, Ino: ino}, nil
}

// NetNS is an open network namespace file; all pod-side work goes through its fd,
// so the namespace checked is the namespace used.
type NetNS struct {
	Path string
	File *os.File
	ID   NSID
}

// Close releases the namespace file.
func (n *NetNS) Close() error { return n.File.Close() }

// OpenNetNS opens path, checks that it is a network namespace and returns it with
// its identity.
func OpenNetNS(path string) (*NetNS, error) {
	if path == "" {
		return nil, fmt.Errorf("%w: CNI_NETNS is empty", ErrNotNetNS)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: open %q: %v", ErrNotNetNS, path, err)
	}
	nstype, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE)
	if err != nil || nstype != unix.CLONE_NEWNET {
		_ = f.Close()
		return nil, fmt.Errorf("%w: %q (nstype %#x, %v)", ErrNotNetNS, path, nstype, err)
	}
	id, err := fstatID(f)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%w: stat %q: %v", ErrNotNetNS, path, err)
	}
	return &NetNS{Path: path, File: f, ID: id}, nil
}

func fstatID(f *os.File) (NSID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return NSID{}, err
	}
	return NSID{Dev: st.Dev, Ino: st.Ino}, nil
}

// StatNSID returns the identity of the namespace file at path.
func StatNSID(path string) (NSID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return NSID{}, err
	}
	return NSID{Dev: st.Dev, Ino: st.Ino}, nil
}

// hostNSPaths are the namespaces a pod namespace must never be: the plugin's own
// (thread and process) and the host's (PID 1's).
var hostNSPaths = []string{"/proc/thread-self/ns/net", "/proc/self/ns/net", "/proc/1/ns/net"}

// guardNotHost returns ErrHostNetNS when id is one of hostNSPaths' namespaces.
// The plugin's own namespace must be readable; PID 1's is skipped if not.
func guardNotHost(id NSID, path string) error {
	for i, p := range hostNSPaths {
		hid, err := StatNSID(p)
		if err != nil {
			if i < 2 {
				return fmt.Errorf("%w: stat %s: %v", ErrNotNetNS, p, err)
			}
			continue
		}
		if hid == id {
			return fmt.Errorf("%w: %q has identity %s, same as %s", ErrHostNetNS, path, id, p)
		}
	}
	return nil
}
