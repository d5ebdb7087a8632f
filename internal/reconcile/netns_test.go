package reconcile

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"golang.org/x/sys/unix"

	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// realNS creates a network namespace with `ip netns add` holding a veth interface
// d0 with addr, and returns its identity as ADD records it. It is removed at cleanup.
func realNS(t *testing.T, addr string) ledger.NetNS {
	t.Helper()
	ns := netenv.Namespace(t, "iplrec")
	name, path := ns.Name, ns.Path
	ip(t, "-n", name, "link", "add", "d0", "type", "veth", "peer", "name", "d1") // no dummy module everywhere
	ip(t, "-n", name, "addr", "add", addr, "dev", "d0")
	ip(t, "-n", name, "link", "set", "d0", "up")
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return ledger.NetNS{Path: path, Dev: st.Dev, Ino: st.Ino}
}

func ip(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// hostLinks lists the host's links other than veths and bridges: those come and go
// with pods of other processes on the machine (a runtime, another package's tests
// running in parallel). Every other link (lo, the uplinks) is compared strictly.
func hostLinks(t *testing.T) []string {
	t.Helper()
	links, err := netlinksafe.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if k := l.Type(); k == "veth" || k == "bridge" {
			continue
		}
		a := l.Attrs()
		out = append(out, fmt.Sprintf("%d %s %s %v", a.Index, a.Name, l.Type(), a.Flags))
	}
	return out
}

func pfx(s string) []netip.Prefix { return []netip.Prefix{netip.MustParsePrefix(s)} }

func hostIdentity(t *testing.T) ledger.NetNS {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	return ledger.NetNS{Path: "/proc/self/ns/net", Dev: st.Dev, Ino: st.Ino}
}

// TestNSFSProbe: the real probe, on namespaces the test made, gives each verdict the
// reconciler acts on, and never opens a namespace that is not the one recorded.
func TestNSFSProbe(t *testing.T) {
	ns := realNS(t, "10.99.0.5/32")
	file := filepath.Join(t.TempDir(), "not-a-netns")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var fst unix.Stat_t
	if err := unix.Stat(file, &fst); err != nil {
		t.Fatal(err)
	}
	other := ns
	other.Ino++
	noID := ns
	noID.Dev, noID.Ino = 0, 0
	for _, c := range []struct {
		name string
		ns   ledger.NetNS
		ips  []netip.Prefix
		want NSState
		info string
	}{
		{"address present", ns, pfx("10.99.0.5/24"), NSAddrPresent, "10.99.0.5 on d0"},
		{"address absent", ns, pfx("10.99.0.6/24"), NSAddrAbsent, ""},
		{"path gone", ledger.NetNS{Path: "/run/netns/iplrec-never-made", Dev: 4, Ino: 1}, pfx("10.99.0.5/24"), NSNotVisible, "does not exist as the agent sees /run/netns"},
		{"directory gone, parent there", ledger.NetNS{Path: "/run/iplrec-no-such-dir/cni-x", Dev: 4, Ino: 1}, pfx("10.99.0.5/24"), NSNotVisible, "nor its directory /run/iplrec-no-such-dir"},
		{"a plain file on another filesystem", ledger.NetNS{Path: file, Dev: ns.Dev, Ino: ns.Ino}, pfx("10.99.0.5/24"), NSNotVisible, "a file on another filesystem"},
		{"directory not visible", ledger.NetNS{Path: "/run/iplrec-no-such-dir/netns/cni-x", Dev: 4, Ino: 1}, pfx("10.99.0.5/24"), NSNotVisible, "not visible"},
		{"no identity recorded, directory not visible", ledger.NetNS{Path: "/run/iplrec-no-such-dir/netns/cni-x"}, pfx("10.99.0.5/24"), NSNotVisible, "not visible"},
		{"path now another namespace", other, pfx("10.99.0.5/24"), NSGone, "another namespace on the nsfs device"},
		{"no identity recorded, address present", noID, pfx("10.99.0.5/24"), NSAddrPresent, "no identity recorded"},
		{"no identity recorded, address absent", noID, pfx("10.99.0.6/24"), NSAddrAbsent, "no identity recorded"},
		{"no identity recorded, path gone", ledger.NetNS{Path: "/run/netns/iplrec-never-made"}, pfx("10.99.0.5/24"), NSNotVisible, "does not exist"},
		{"no identity recorded, a plain file", ledger.NetNS{Path: file}, pfx("10.99.0.5/24"), NSNotVisible, "holds no network namespace as the agent sees it"},
		{"no identity recorded, now the host's", ledger.NetNS{Path: "/proc/self/ns/net"}, pfx("127.0.0.1/8"), NSGone, "host's namespace"},
		{"not recorded", ledger.NetNS{}, pfx("10.99.0.5/24"), NSNotRecorded, ""},
		{"the host's namespace", hostIdentity(t), pfx("127.0.0.1/8"), NSUnknown, "refused"},
		{"a plain file", ledger.NetNS{Path: file, Dev: fst.Dev, Ino: fst.Ino}, pfx("10.99.0.5/24"), NSUnknown, "not a network namespace"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, info := NSFS{}.Probe(c.ns, c.ips)
			if got != c.want || !strings.Contains(info, c.info) {
				t.Fatalf("Probe = %s %q, want %s with %q", got, info, c.want, c.info)
			}
		})
	}
}

// TestNSFSReclaim: reclaim removes the one interface holding the address in the
// recorded namespace; it refuses the host's namespace and the loopback interface,
// and the host's links stay as they were.
func TestNSFSReclaim(t *testing.T) {
	hostBefore := hostLinks(t)
	ns := realNS(t, "10.99.1.5/32")
	ip(t, "-n", filepath.Base(ns.Path), "addr", "add", "10.99.1.9/32", "dev", "lo")

	if _, err := (NSFS{}).Reclaim(ns, "d0", pfx("10.99.1.9/24")); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("reclaim of an address on lo: %v, want refused", err)
	}
	if _, err := (NSFS{}).Reclaim(hostIdentity(t), "lo", pfx("127.0.0.1/8")); err == nil || !strings.Contains(err.Error(), "host") {
		t.Fatalf("reclaim in the host's namespace: %v, want refused", err)
	}
	other := ns
	other.Ino++
	if _, err := (NSFS{}).Reclaim(other, "d0", pfx("10.99.1.5/24")); err == nil {
		t.Fatal("reclaim in a namespace whose identity does not match: no error")
	}
	if _, err := (NSFS{}).Reclaim(ledger.NetNS{Path: ns.Path}, "d0", pfx("10.99.1.5/24")); err == nil || !strings.Contains(err.Error(), "no namespace identity") {
		t.Fatalf("reclaim in a namespace whose identity was not recorded: %v, want refused", err)
	}
	what, err := NSFS{}.Reclaim(ns, "d0", pfx("10.99.1.5/24"))
	if err != nil || !strings.Contains(what, "removed interface d0") {
		t.Fatalf("reclaim = %q, %v", what, err)
	}
	if st, info := (NSFS{}).Probe(ns, pfx("10.99.1.5/24")); st != NSAddrAbsent {
		t.Fatalf("after reclaim Probe = %s %s, want absent", st, info)
	}
	if out := ip(t, "-n", filepath.Base(ns.Path), "-o", "link", "show"); !strings.Contains(out, " lo:") || strings.Contains(out, "d0") {
		t.Fatalf("links in the namespace after reclaim:\n%s", out)
	}
	if after := hostLinks(t); !slices.Equal(after, hostBefore) {
		t.Fatalf("host links changed:\n%v\n%v", hostBefore, after)
	}
}

// TestUnrecordedIdentityResolved: a lease whose namespace path exists but whose
// identity was never recorded is not kept UNKNOWN forever. With the real probe, a
// gone sandbox whose namespace at that path no longer holds the address is released
// within the grace; one whose namespace still holds it is kept as stranded, and is
// never reclaimed (nothing proves the namespace is the one of the ADD).
func TestUnrecordedIdentityResolved(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.Netns = NSFS{}; o.ReclaimStranded = true; o.StrandedGrace = time.Second })
	ns := realNS(t, "10.246.0.250/32")
	alloc := func(id string) ledger.Lease {
		t.Helper()
		ls, _, err := f.l.Allocate(ledger.AllocateRequest{Key: key(id), Pod: ledger.Pod{UID: "u-" + id}, NetNS: ledger.NetNS{Path: ns.Path}, Ranges: ranges})
		if err != nil {
			t.Fatal(err)
		}
		f.r.age(ls)
		return ls
	}
	absent := alloc("absent")
	f.clk.Advance(time.Hour)
	f.untilReleased("absent", 10)
	if r := lastReason(t, f.l, absent); r != ledger.ReasonReconcileGone {
		t.Fatalf("reason %s", r)
	}
	// the namespace at the path holds the lease's address: stranded, kept, not reclaimed
	present := alloc("present")
	addr := present.IPs[0].Addr().String()
	ip(t, "-n", filepath.Base(ns.Path), "addr", "add", addr+"/32", "dev", "d0")
	f.rt.set("present", cri.StateNotReady)
	f.clk.Advance(time.Hour)
	if n := f.rounds(20); n != 0 || !f.held("present") {
		t.Fatal("released a lease whose address is still configured at its namespace path")
	}
	a := f.r.Summary()
	if a.Stranded != 1 {
		t.Fatalf("audit %+v, want one stranded", a)
	}
	if out := ip(t, "-n", filepath.Base(ns.Path), "-o", "addr", "show"); !strings.Contains(out, addr) {
		t.Fatalf("the interface was reclaimed without a recorded identity:\n%s", out)
	}
}

// TestNSFSReclaimOnlyOwnInterface: reclaim removes only the lease's own veth. An
// address of the lease on another plugin's interface (a bridge named as the lease's
// interface, a veth of another name, as with Multus and an overlapping range) is
// refused with ErrNotOwnInterface and every link stays.
func TestNSFSReclaimOnlyOwnInterface(t *testing.T) {
	ns := realNS(t, "10.99.2.5/32") // d0, a veth, carries the address
	name := filepath.Base(ns.Path)
	ip(t, "-n", name, "link", "add", "eth0", "type", "bridge")
	ip(t, "-n", name, "addr", "add", "10.99.2.6/32", "dev", "eth0")
	links := func() string { return ip(t, "-n", name, "-o", "-br", "link", "show") }
	before := links()
	for _, c := range []struct {
		name, ifname, addr, why string
	}{
		{"a veth of another name", "eth0", "10.99.2.5/24", "on d0 (veth)"},
		{"the lease's name on a bridge", "eth0", "10.99.2.6/24", "is a bridge, not a veth"},
		{"no interface name recorded", "", "10.99.2.5/24", "no interface name"},
	} {
		t.Run(c.name, func(t *testing.T) {
			what, err := NSFS{}.Reclaim(ns, c.ifname, pfx(c.addr))
			if !errors.Is(err, ErrNotOwnInterface) || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("Reclaim = %q, %v; want ErrNotOwnInterface saying %q", what, err, c.why)
			}
			if after := links(); after != before {
				t.Fatalf("links changed:\n%s\n%s", before, after)
			}
		})
	}
	// the lease's own veth also holds an address the other interface holds: refused
	ip(t, "-n", name, "addr", "add", "10.99.2.6/32", "dev", "d0")
	if _, err := (NSFS{}).Reclaim(ns, "d0", pfx("10.99.2.6/24")); !errors.Is(err, ErrNotOwnInterface) {
		t.Fatalf("reclaim of an address another interface carries too: %v", err)
	}
	if after := links(); after != before {
		t.Fatalf("links changed:\n%s\n%s", before, after)
	}
}

// TestStrandedReclaimKeepsForeignInterface: with --reclaim-stranded and the real
// namespace, a NOTREADY sandbox's lease whose address is on an interface that is not
// its own veth is kept, reported stranded, and the interface stays.
func TestStrandedReclaimKeepsForeignInterface(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.Netns = NSFS{}; o.ReclaimStranded = true; o.StrandedGrace = time.Second })
	ns := realNS(t, "10.99.3.1/32")
	ls, _, err := f.l.Allocate(ledger.AllocateRequest{Key: key("multus"), Pod: ledger.Pod{UID: "u-multus"}, NetNS: ns, Ranges: ranges})
	if err != nil {
		t.Fatal(err)
	}
	f.r.age(ls)
	addr := ls.IPs[0].Addr().String()
	// key's ifname is eth0; the address is on d0, another plugin's veth
	ip(t, "-n", filepath.Base(ns.Path), "addr", "add", addr+"/32", "dev", "d0")
	f.rt.set("multus", cri.StateNotReady)
	f.clk.Advance(time.Hour)
	if n := f.rounds(20); n != 0 || !f.held("multus") {
		t.Fatal("released a lease whose address is on another plugin's interface")
	}
	if a := f.r.Summary(); a.Stranded != 1 {
		t.Fatalf("audit %+v, want one stranded", a)
	}
	if out := ip(t, "-n", filepath.Base(ns.Path), "-o", "addr", "show", "dev", "d0"); !strings.Contains(out, addr) {
		t.Fatalf("another plugin's interface was removed:\n%s", out)
	}
}
