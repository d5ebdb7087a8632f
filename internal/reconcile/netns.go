package reconcile

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/nsenter"
)

// NSFS is the Netns of the running system: it reads the namespace files recorded
// at ADD. A probe stats the recorded path (no namespace is touched when the path is
// gone or holds another namespace); only when the identity matches does it open
// the nsfs file, check its type, dev+inode and that it is not the host's, and list
// the namespace's addresses through a netlink socket created in it (the calling
// thread, locked, joins the namespace only for the socket(2) call and returns to
// its own; nothing is written). Reclaim deletes one link through such a socket.
type NSFS struct {
	// HostPID tells whether the agent sees the host's PID namespace; nil reads
	// /proc/self/ns/pid (see hostPID). For tests.
	HostPID func() bool
}

var _ Netns = NSFS{}

// hostNS are namespaces that must never be probed or changed: the agent's own and
// PID 1's.
var hostNS = []string{"/proc/self/ns/net", "/proc/thread-self/ns/net", "/proc/1/ns/net"}

// initPIDNSIno is the inode of the kernel's initial PID namespace
// (PROC_PID_INIT_INO in include/linux/proc_ns.h, fixed since Linux 3.8).
const initPIDNSIno = 0xEFFFFFFC

// hostPID reports whether the agent's /proc shows the host's PID namespace (the
// kernel's initial one), where the runtime's /proc/PID paths name the same
// processes. Anywhere else (a pod without hostPID, a nested node such as kind's) a
// PID the agent does not see may be a live process of the runtime's namespace.
func hostPID() bool {
	var st unix.Stat_t
	return unix.Stat("/proc/self/ns/pid", &st) == nil && st.Ino == initPIDNSIno
}

// procPID is the process directory of a /proc/PID/ns/net or
// /proc/PID/task/TID/ns/net path (cri-dockerd's CNI_NETNS), or "".
func procPID(path string) string {
	p := strings.Split(filepath.Clean(path), "/")
	if len(p) < 5 || p[0] != "" || p[1] != "proc" || p[len(p)-2] != "ns" {
		return ""
	}
	if _, err := strconv.ParseUint(p[2], 10, 32); err != nil {
		return ""
	}
	return "/proc/" + p[2]
}

// mountHint is the fix for a namespace directory the agent cannot see.
func mountHint(dir string) string {
	return fmt.Sprintf("%s%s, mount the host's %s into the agent with mountPropagation: HostToContainer", mountHintPrefix, dir, dir)
}

const mountHintPrefix = "if the runtime keeps its namespaces in "

// absent judges a recorded namespace path that does not resolve. Its absence
// alone is no evidence: a directory the agent's container does not mount, or
// mounts without propagation, shows nothing (or the bare mount points) where the
// runtime has namespaces. So it is NSNotVisible, which the reconciler turns into
// NSGone only on positive evidence (see Reconciler.probe). One case is decided
// here: a /proc/PID path whose process is gone while the agent sees the host's
// PID namespace (checked by hostPID).
func (n NSFS) absent(path string) (*os.File, NSState, string) {
	if pd := procPID(path); pd != "" {
		if _, err := os.Stat(pd); errors.Is(err, os.ErrNotExist) {
			if n.hostPID() {
				return nil, NSGone, fmt.Sprintf("%s does not exist: process %s is gone and the agent sees the host's PID namespace", path, filepath.Base(pd))
			}
			return nil, NSNotVisible, fmt.Sprintf("%s does not exist, but the agent does not see the host's PID namespace, where the runtime's PID may still run; run the agent with hostPID: true", path)
		}
	}
	dir := filepath.Dir(path)
	if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
		return nil, NSNotVisible, fmt.Sprintf("%s does not exist as the agent sees %s; %s", path, dir, mountHint(dir))
	}
	if fi, err := os.Stat(filepath.Dir(dir)); err == nil && fi.IsDir() {
		return nil, NSNotVisible, fmt.Sprintf("%s does not exist, nor its directory %s, as the agent sees them; %s", path, dir, mountHint(dir))
	}
	return nil, NSNotVisible, fmt.Sprintf("%s: its directory is not visible to the agent, nor that directory's parent; %s", path, mountHint(dir))
}

func (n NSFS) hostPID() bool {
	if n.HostPID != nil {
		return n.HostPID()
	}
	return hostPID()
}

// open opens the namespace recorded in ns with every identity check, or says why not.
//
// When the lease recorded a path but no identity (dev:inode; the plugin could not
// stat the path at ADD), the namespace at the path cannot be proven to be the
// recorded one. With read=true (Probe) it is still judged by what is there: a path
// that now holds the host's namespace (a pod's namespace is never the host's: ADD
// refuses it) cannot hold the pod's namespace, so it is NSGone; a plain file there
// may be a mount point whose mount the agent does not see (NSNotVisible, like a
// missing path); any other network namespace there is opened
// read-only and its addresses decide — still configured there means kept
// (stranded), absent means the address is not in use at the path the runtime gave.
// The sandbox verdict (gone or NOTREADY) is the other half of the evidence. Without
// this the lease would stay UNKNOWN, and so kept, forever. With read=false (Reclaim,
// which changes the namespace) an unrecorded identity is refused.
func (n NSFS) open(ns ledger.NetNS, read bool) (*os.File, NSState, string) {
	if ns.Path == "" {
		return nil, NSNotRecorded, ""
	}
	var st unix.Stat_t
	if err := unix.Stat(ns.Path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return n.absent(ns.Path)
		}
		return nil, NSUnknown, fmt.Sprintf("stat %s: %v", ns.Path, err)
	}
	recorded := ns.Ino != 0
	if !recorded && !read {
		return nil, NSUnknown, "no namespace identity recorded for " + ns.Path
	}
	if recorded && st.Dev == ns.Dev && st.Ino != ns.Ino {
		// another file of the nsfs device: another namespace is mounted there
		return nil, NSGone, fmt.Sprintf("%s is now %d:%d, another namespace on the nsfs device, not the namespace %d:%d recorded at ADD", ns.Path, st.Dev, st.Ino, ns.Dev, ns.Ino)
	}
	if recorded && st.Dev != ns.Dev {
		// a file of another filesystem: the bare mount point, as a container sees
		// a namespace mounted after it started, without mount propagation
		dir := filepath.Dir(ns.Path)
		return nil, NSNotVisible, fmt.Sprintf("%s is now %d:%d, a file on another filesystem than the namespace %d:%d recorded at ADD: the mount point without its mount, as the agent sees it; %s", ns.Path, st.Dev, st.Ino, ns.Dev, ns.Ino, mountHint(dir))
	}
	f, err := os.OpenFile(ns.Path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return n.absent(ns.Path)
		}
		return nil, NSUnknown, err.Error()
	}
	var fst unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &fst); err != nil || fst.Dev != st.Dev || fst.Ino != st.Ino {
		f.Close()
		return nil, NSUnknown, "namespace changed while opening " + ns.Path
	}
	if t, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE); err != nil || t != unix.CLONE_NEWNET {
		f.Close()
		if !recorded {
			dir := filepath.Dir(ns.Path)
			return nil, NSNotVisible, fmt.Sprintf("%s holds no network namespace as the agent sees it (no identity was recorded at ADD); %s", ns.Path, mountHint(dir))
		}
		return nil, NSUnknown, ns.Path + " is not a network namespace"
	}
	for _, h := range hostNS {
		var hs unix.Stat_t
		if unix.Stat(h, &hs) == nil && hs.Dev == fst.Dev && hs.Ino == fst.Ino {
			f.Close()
			if !recorded {
				return nil, NSGone, fmt.Sprintf("%s is now the host's namespace (%s), which no pod's namespace is (no identity was recorded at ADD)", ns.Path, h)
			}
			return nil, NSUnknown, fmt.Sprintf("refused: %s is the host's namespace (%s)", ns.Path, h)
		}
	}
	return f, NSAddrAbsent, ""
}

// handle opens a netlink handle inside the namespace f (see nsenter: a thread
// that cannot come back from f is retired, never reused by the agent).
func handle(f *os.File) (*netlink.Handle, error) {
	return nsenter.Handle(int(f.Fd()))
}

// holder is a link carrying one of a lease's addresses.
type holder struct {
	link netlink.Link
	ip   netip.Addr
}

// holders returns every link carrying one of ips, with the address, in the
// kernel's order of addresses.
func holders(h *netlink.Handle, ips []netip.Prefix) ([]holder, error) {
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	want := map[netip.Addr]bool{}
	for _, p := range ips {
		want[p.Addr()] = true
	}
	var out []holder
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || !want[ip.Unmap()] {
			continue
		}
		l, err := h.LinkByIndex(a.LinkIndex)
		if err != nil {
			return nil, err
		}
		out = append(out, holder{l, ip.Unmap()})
	}
	return out, nil
}

// find returns the first link carrying one of ips and the address, if any.
func find(h *netlink.Handle, ips []netip.Prefix) (netlink.Link, netip.Addr, error) {
	hs, err := holders(h, ips)
	if err != nil || len(hs) == 0 {
		return nil, netip.Addr{}, err
	}
	return hs[0].link, hs[0].ip, nil
}

// Probe implements Netns.
func (n NSFS) Probe(ns ledger.NetNS, ips []netip.Prefix) (NSState, string) {
	f, st, info := n.open(ns, true)
	if f == nil {
		return st, info
	}
	defer f.Close()
	h, err := handle(f)
	if err != nil {
		return NSUnknown, fmt.Sprintf("netlink in %s: %v", ns.Path, err)
	}
	defer h.Close()
	l, ip, err := find(h, ips)
	if err != nil {
		return NSUnknown, fmt.Sprintf("addresses in %s: %v", ns.Path, err)
	}
	note := ""
	if ns.Ino == 0 {
		note = " (no identity recorded at ADD: judged by the namespace now at the path)"
	}
	if l == nil {
		return NSAddrAbsent, strings.TrimPrefix(note, " ")
	}
	return NSAddrPresent, fmt.Sprintf("%s on %s in %s%s", ip, l.Attrs().Name, ns.Path, note)
}

// Reclaim implements Netns: it deletes the lease's own interface, ifname, in the
// namespace recorded at ADD, after the identity checks, when that interface is a
// veth (what ipledger-veth, ptp and bridge give a pod) and no other link carries
// one of ips. An address on another link (another plugin's interface, as with
// Multus and a second network on an overlapping range; or lo) or an ifname that
// is not a veth is refused with ErrNotOwnInterface: nothing is deleted.
func (n NSFS) Reclaim(ns ledger.NetNS, ifname string, ips []netip.Prefix) (string, error) {
	f, st, info := n.open(ns, false)
	if f == nil {
		return "", fmt.Errorf("reclaim: namespace %s: %s (%s)", ns.Path, st, info)
	}
	defer f.Close()
	h, err := handle(f)
	if err != nil {
		return "", fmt.Errorf("reclaim: netlink in %s: %w", ns.Path, err)
	}
	defer h.Close()
	hs, err := holders(h, ips)
	if err != nil {
		return "", fmt.Errorf("reclaim: addresses in %s: %w", ns.Path, err)
	}
	if len(hs) == 0 {
		return "address already absent from " + ns.Path, nil
	}
	for _, o := range hs {
		a := o.link.Attrs()
		switch {
		case a.Flags&net.FlagLoopback != 0 || a.Name == "lo":
			return "", fmt.Errorf("reclaim: %w: %s is on the loopback interface of %s; refused", ErrNotOwnInterface, o.ip, ns.Path)
		case ifname == "":
			return "", fmt.Errorf("reclaim: %w: the lease records no interface name; %s on %s in %s kept", ErrNotOwnInterface, o.ip, a.Name, ns.Path)
		case a.Name != ifname:
			return "", fmt.Errorf("reclaim: %w: %s is on %s (%s) in %s, not on the lease's interface %s: another plugin's interface on an overlapping range? kept", ErrNotOwnInterface, o.ip, a.Name, o.link.Type(), ns.Path, ifname)
		case o.link.Type() != "veth":
			return "", fmt.Errorf("reclaim: %w: %s in %s is a %s, not a veth; kept", ErrNotOwnInterface, ifname, ns.Path, o.link.Type())
		}
	}
	l, ip := hs[0].link, hs[0].ip
	if err := h.LinkDel(l); err != nil {
		return "", fmt.Errorf("reclaim: delete %s in %s: %w", l.Attrs().Name, ns.Path, err)
	}
	return fmt.Sprintf("removed interface %s (holding %s) in netns %s (%d:%d)", l.Attrs().Name, ip, ns.Path, ns.Dev, ns.Ino), nil
}
