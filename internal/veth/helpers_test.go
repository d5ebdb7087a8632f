package veth_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/debpkg"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// binDir is CNI_PATH for every test: ipledger-veth built from this tree, Debian's
// host-local, and fake IPAM scripts.
var binDir string

// portmapDir holds portmap as make build builds it (go.mod's containernetworking/
// plugins), the one the image ships; Debian's is in /usr/lib/cni.
var portmapDir string

const pluginType = "ipledger-veth"

// Fake IPAM plugins. Each appends "COMMAND CONTAINERID" to $dir/fake-ipam.log.
const (
	failIPAM = `#!/bin/sh
echo "$CNI_COMMAND $CNI_CONTAINERID" >> "$(dirname "$0")/fake-ipam.log"
case "$CNI_COMMAND" in
VERSION) echo '{"cniVersion":"1.1.0","supportedVersions":["0.3.1","0.4.0","1.0.0","1.1.0"]}';;
ADD) echo '{"cniVersion":"1.1.0","code":11,"msg":"fake IPAM: pool exhausted, try again later"}'; exit 1;;
*) exit 0;;
esac
`
	// routeCheckIPAM hands out 10.250.0.250 (pool index 15) and, at DEL, logs the
	// host's routes to it: what is still routed at the moment of the release.
	routeCheckIPAM = `#!/bin/sh
log="$(dirname "$0")/routecheck-ipam.log"
case "$CNI_COMMAND" in
VERSION) echo '{"cniVersion":"1.1.0","supportedVersions":["0.3.1","0.4.0","1.0.0","1.1.0"]}';;
ADD) echo '{"cniVersion":"1.0.0","ips":[{"address":"10.250.0.250/24"}]}';;
DEL) { echo "DEL $CNI_CONTAINERID"; ip -4 route show 10.250.0.250/32; echo "END"; } >> "$log";;
esac
exit 0
`
	noIPIPAM = `#!/bin/sh
echo "$CNI_COMMAND $CNI_CONTAINERID" >> "$(dirname "$0")/fake-ipam.log"
case "$CNI_COMMAND" in
VERSION) echo '{"cniVersion":"1.1.0","supportedVersions":["0.3.1","0.4.0","1.0.0","1.1.0"]}';;
ADD) echo '{"cniVersion":"1.0.0","ips":[]}';;
*) exit 0;;
esac
`
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "ipledger-veth-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	// iproute2, Debian's host-local and portmap, and the iptables portmap runs,
	// installed if missing under the lock every test process takes (another
	// package's test may be installing them now).
	if err := debpkg.Ensure(debpkg.IPRoute2, debpkg.CNIPlugins, debpkg.IPTables); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The plugins and portmap as `make build` builds them, from the build the
	// agent tests share (agentenv.Bin: cached, built once for the checkout).
	shipped, err := agentenv.BinDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, "build:", err)
		return 1
	}
	portmapDir = shipped
	for _, name := range []string{pluginType, "ipledger"} {
		if err := os.Symlink(filepath.Join(shipped, name), filepath.Join(dir, name)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	if err := os.Symlink("/usr/lib/cni/host-local", filepath.Join(dir, "host-local")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for name, body := range map[string]string{"fail-ipam": failIPAM, "noip-ipam": noIPIPAM, "routecheck-ipam": routeCheckIPAM} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}

// pool is a slice of the test ranges 10.250.0.0/24 and fd00:250::/64 (never
// routed off the machine). Each test uses its own index so nothing collides.
type pool struct{ idx int }

func (p pool) v4Start() string { return fmt.Sprintf("10.250.0.%d", p.idx*16+2) }
func (p pool) v4End() string   { return fmt.Sprintf("10.250.0.%d", p.idx*16+14) }
func (p pool) v6Start() string { return fmt.Sprintf("fd00:250::%x", p.idx*16+2) }
func (p pool) v6End() string   { return fmt.Sprintf("fd00:250::%x", p.idx*16+14) }

// ipamEnv is one IPAM plugin under test (host-local now; ipledger later).
type ipamEnv interface {
	// Section is the ipam section for a network drawing from p (single address
	// per family when single is set, to exhaust it easily).
	Section(p pool, dualStack, single bool) map[string]any
	// Leases are the addresses held in network.
	Leases(t *testing.T, network string) []string
}

type ipamKind struct {
	name string
	new  func(t *testing.T) ipamEnv
}

// ipamKinds lists the IPAM plugins every plugin test runs against: Debian's host-local
// and ours, with a real ipledgerd per test (audited when the test ends).
var ipamKinds = []ipamKind{
	{name: "host-local", new: func(t *testing.T) ipamEnv { return &hostLocal{dataDir: t.TempDir()} }},
	{name: "ipledger", new: func(t *testing.T) ipamEnv {
		return &ipledgerIPAM{a: agentenv.Start(t, agentenv.Options{Args: []string{"--reuse-delay", "0s"}})}
	}},
}

type ipledgerIPAM struct{ a *agentenv.Agent }

func (i *ipledgerIPAM) Section(p pool, dualStack, single bool) map[string]any {
	s := (&hostLocal{}).Section(p, dualStack, single)
	s["type"] = "ipledger"
	delete(s, "dataDir")
	s["socket"] = i.a.Socket
	s["spoolDir"] = i.a.SpoolDir
	return s
}

func (i *ipledgerIPAM) Leases(t *testing.T, network string) []string {
	t.Helper()
	var out []string
	for _, l := range i.a.Leases(t) {
		if l.Network != network {
			continue
		}
		for _, ip := range l.IPs {
			out = append(out, strings.Split(ip, "/")[0])
		}
	}
	return out
}

type hostLocal struct{ dataDir string }

func (h *hostLocal) Section(p pool, dualStack, single bool) map[string]any {
	end4, end6 := p.v4End(), p.v6End()
	if single {
		end4, end6 = p.v4Start(), p.v6Start()
	}
	ranges := []any{[]any{map[string]any{"subnet": "10.250.0.0/24", "rangeStart": p.v4Start(), "rangeEnd": end4}}}
	if dualStack {
		ranges = append(ranges, []any{map[string]any{"subnet": "fd00:250::/64", "rangeStart": p.v6Start(), "rangeEnd": end6}})
	}
	return map[string]any{"type": "host-local", "dataDir": h.dataDir, "ranges": ranges}
}

func (h *hostLocal) Leases(t *testing.T, network string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(h.dataDir, network))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if net.ParseIP(e.Name()) != nil {
			out = append(out, e.Name())
		}
	}
	return out
}

// echoSeq gives each ping its own ICMP echo ID.
var echoSeq atomic.Int64

// cleanupNetwork removes, in t.Cleanup, any host veth a failed test left for
// network (in the current namespace).
func cleanupNetwork(t *testing.T, network string) {
	t.Cleanup(func() {
		links, _ := netlinksafe.LinkList()
		for _, l := range links {
			if strings.Contains(l.Attrs().Alias, "net="+network+" ") {
				t.Errorf("leftover host veth %s (%s); removing", l.Attrs().Name, l.Attrs().Alias)
				_ = netlink.LinkDel(l)
			}
		}
	})
}

func confBytes(t *testing.T, version, network string, ipam map[string]any, extra map[string]any) []byte {
	t.Helper()
	c := map[string]any{"cniVersion": version, "name": network, "type": pluginType, "ipam": ipam}
	for k, v := range extra {
		c[k] = v
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func confList(t *testing.T, version, network string, ipam map[string]any) *libcni.NetworkConfigList {
	t.Helper()
	return listOf(t, version, network, map[string]any{"type": pluginType, "ipam": ipam, "mtu": 1400})
}

// listOf is the conflist of network chaining plugins in order.
func listOf(t *testing.T, version, network string, plugins ...map[string]any) *libcni.NetworkConfigList {
	t.Helper()
	b, err := json.Marshal(map[string]any{"cniVersion": version, "name": network, "plugins": plugins})
	if err != nil {
		t.Fatal(err)
	}
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func newCNI(t *testing.T) *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir([]string{binDir}, t.TempDir(), nil)
}

// plugin runs the plugin binary directly, as a runtime would, with netns as
// CNI_NETNS exactly (even empty).
type pluginRun struct {
	stdout, stderr []byte
	err            error
}

func execPlugin(t *testing.T, command, containerID, netns, ifName string, conf []byte) pluginRun {
	t.Helper()
	return execPluginPath(t, binDir, command, containerID, netns, ifName, conf)
}

// execPluginPath is execPlugin with cniPath as CNI_PATH.
func execPluginPath(t *testing.T, cniPath, command, containerID, netns, ifName string, conf []byte) pluginRun {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, pluginType))
	cmd.Env = []string{"CNI_COMMAND=" + command, "CNI_CONTAINERID=" + containerID, "CNI_NETNS=" + netns,
		"CNI_IFNAME=" + ifName, "CNI_PATH=" + cniPath, "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdin = bytes.NewReader(conf)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if errb.Len() > 0 {
		t.Logf("%s %s stderr: %s", pluginType, command, errb.String())
	}
	return pluginRun{stdout: out.Bytes(), stderr: errb.Bytes(), err: err}
}

// cniError decodes the CNI error JSON a failing plugin printed.
func (r pluginRun) cniError(t *testing.T) *types.Error {
	t.Helper()
	if r.err == nil {
		t.Fatalf("plugin succeeded, want error; stdout %s", r.stdout)
	}
	e := &types.Error{}
	if err := json.Unmarshal(r.stdout, e); err != nil {
		t.Fatalf("plugin error output %q: %v", r.stdout, err)
	}
	return e
}

func (r pluginRun) ok(t *testing.T) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("plugin failed: %v; stdout %s; stderr %s", r.err, r.stdout, r.stderr)
	}
}

// linkState is the part of a host link we compare before and after.
type linkState struct {
	Index int
	Name  string
	Flags net.Flags
	Alias string
	Kind  string // netlink link type: veth, bridge, device, ...
}

// foreign reports whether l is a pod or bridge link of another process on the
// machine: a veth or bridge that is not one of these tests' networks (all named
// iplt-*). A runtime or another package's test (go test runs packages in parallel)
// creates and removes such links at any time; they are not the plugin's doing.
// Every other host link (lo, the uplinks, our networks' veths) is compared strictly.
func (l linkState) foreign() bool {
	return (l.Kind == "veth" || l.Kind == "bridge") && !strings.Contains(l.Alias, " net=iplt-")
}

// hostLinks lists the host's links, without foreign ones.
func hostLinks(t *testing.T) []linkState {
	t.Helper()
	links, err := netlinksafe.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []linkState
	for _, l := range links {
		a := l.Attrs()
		if s := (linkState{a.Index, a.Name, a.Flags, a.Alias, l.Type()}); !s.foreign() {
			out = append(out, s)
		}
	}
	return out
}

func loFlags(t *testing.T) net.Flags {
	t.Helper()
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	return lo.Attrs().Flags
}

func routesTo(t *testing.T, ip net.IP) []netlink.Route {
	t.Helper()
	fam := netlink.FAMILY_V6
	if ip.To4() != nil {
		fam = netlink.FAMILY_V4
	}
	rs, err := netlink.RouteListFiltered(fam, &netlink.Route{Dst: &net.IPNet{IP: ip, Mask: net.CIDRMask(len(ip)*8, len(ip)*8)}}, netlink.RT_FILTER_DST)
	if err != nil {
		t.Fatal(err)
	}
	var out []netlink.Route
	for _, r := range rs {
		if r.Dst != nil && r.Dst.IP.Equal(ip) {
			if ones, bits := r.Dst.Mask.Size(); ones == bits {
				out = append(out, r)
			}
		}
	}
	return out
}

// inNS runs f with the calling OS thread in the namespace at path; processes it
// starts (libcni's plugin execs) inherit that namespace.
func inNS(t *testing.T, path string, f func() error) {
	t.Helper()
	if err := ns.WithNetNSPath(path, func(ns.NetNS) error { return f() }); err != nil {
		t.Fatalf("in %s: %v", path, err)
	}
}

// ping sends at most 3 ICMP echo requests (1s wait each) from inside the
// namespace at nsPath to dst and fails the test if none is answered.
func ping(t *testing.T, nsPath string, dst net.IP) {
	t.Helper()
	var got bool
	var last error
	inNS(t, nsPath, func() error {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		network, laddr, proto := "ip4:icmp", "0.0.0.0", 1
		var typ, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
		if dst.To4() == nil {
			network, laddr, proto = "ip6:ipv6-icmp", "::", 58
			typ, reply = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
		}
		c, err := icmp.ListenPacket(network, laddr)
		if err != nil {
			return err
		}
		defer c.Close()
		id := int(echoSeq.Add(1)) & 0xffff
		for seq := 1; seq <= 3 && !got; seq++ {
			msg := icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("ipledger-veth test")}}
			b, err := msg.Marshal(nil)
			if err != nil {
				return err
			}
			if _, err := c.WriteTo(b, &net.IPAddr{IP: dst}); err != nil {
				last = err
				time.Sleep(time.Second)
				continue
			}
			deadline := time.Now().Add(time.Second)
			_ = c.SetReadDeadline(deadline)
			buf := make([]byte, 1500)
			for time.Now().Before(deadline) {
				n, from, err := c.ReadFrom(buf)
				if err != nil {
					last = err
					break
				}
				m, err := icmp.ParseMessage(proto, buf[:n])
				if err != nil || m.Type != reply {
					continue
				}
				if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id && from.(*net.IPAddr).IP.Equal(dst) {
					got = true
					break
				}
			}
		}
		return nil
	})
	if !got {
		t.Fatalf("ping from %s to %s: no reply in 3 tries (%v)", nsPath, dst, last)
	}
}

func ipsOf(t *testing.T, r types.Result) []net.IP {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		IPs []struct{ Address string } `json:"ips"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	var out []net.IP
	for _, ip := range res.IPs {
		a, _, err := net.ParseCIDR(ip.Address)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

func resultIPs(t *testing.T, stdout []byte) []net.IP {
	t.Helper()
	var res struct {
		IPs []struct{ Address string } `json:"ips"`
	}
	if err := json.Unmarshal(stdout, &res); err != nil {
		t.Fatalf("result %s: %v", stdout, err)
	}
	var out []net.IP
	for _, ip := range res.IPs {
		a, _, err := net.ParseCIDR(ip.Address)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

func strs(ips []net.IP) []string {
	var out []string
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	slices.Sort(out)
	return out
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

// linksChanged reports whether the host's links (foreign ones left out, see
// hostLinks) differ in a way the plugin could have caused: a link that existed
// before is gone or changed, or a new link carries our prefix. New links of other
// kinds come from other processes on the machine (a runtime, another test binary)
// and are not the plugin's doing.
func linksChanged(before, after []linkState) bool {
	now := map[int]linkState{}
	for _, l := range after {
		now[l.Index] = l
	}
	was := map[int]bool{}
	for _, l := range before {
		was[l.Index] = true
		// RUNNING (carrier) comes on by itself some time after a veth is set up,
		// not by anything a later call does: compare the rest.
		n := now[l.Index]
		n.Flags, l.Flags = n.Flags&^net.FlagRunning, l.Flags&^net.FlagRunning
		if n != l {
			return true
		}
	}
	for _, l := range after {
		if !was[l.Index] && strings.HasPrefix(l.Name, "ipl") {
			return true
		}
	}
	return false
}
