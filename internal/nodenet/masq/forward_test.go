package masq_test

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/nodenet/masq"
	"github.com/ipledger/ipledger/internal/testenv/debpkg"
	"github.com/ipledger/ipledger/internal/testenv/netnodes"
)

// TestForwardDropPolicy: a router namespace whose iptables FORWARD policy is DROP
// (as Docker or ufw leave it) and whose IPv4 forwarding is off forwards nothing
// between two pods; after Forward.Sync it forwards both ways, `iptables -S` reads
// the accepts as its own rules, and a second Sync writes nothing; after Remove it
// drops again and FORWARD is as the operator left it.
func TestForwardDropPolicy(t *testing.T) {
	debpkg.Need(t, debpkg.IPTables) // iptables-nft reads the rules back as iptables would
	if _, err := exec.LookPath("iptables-nft"); err != nil {
		t.Fatalf("Debian's iptables package is installed but iptables-nft is not on PATH: %v", err)
	}
	env := netnodes.New(t, 1)
	router := env.Node(0)
	a := env.AddPod(router, "a", netip.MustParseAddr("10.244.0.2"))
	b := env.AddPod(router, "b", netip.MustParseAddr("10.244.1.3"))
	iptables := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"netns", "exec", router.Netns, "iptables-nft"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("iptables-nft %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	sysctl := func(key, val string) string {
		t.Helper()
		var got []byte
		err := router.Do(func() (err error) {
			p := filepath.Join("/proc/sys/net", key)
			if val != "" {
				if err := os.WriteFile(p, []byte(val), 0o644); err != nil {
					return err
				}
			}
			got, err = os.ReadFile(p)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(got))
	}
	sysctl("ipv4/ip_forward", "0") // a distribution's default
	iptables("-P", "FORWARD", "DROP")
	iptables("-A", "FORWARD", "-s", "192.0.2.1/32", "-j", "DROP") // the operator's own rule
	netnodes.ServeSource(t, b.NS, ":7000")
	netnodes.ServeSource(t, a.NS, ":7000")
	if _, err := a.SourceSeen(netip.MustParseAddrPort("10.244.1.3:7000")); err == nil {
		t.Fatal("pod a reached pod b through a router with FORWARD DROP and forwarding off")
	}

	f := masq.NewForward(router.Handle)
	pods := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/56")}
	st, err := f.Sync(pods)
	if err != nil {
		t.Fatalf("Sync: %v (status %+v)", err, st)
	}
	if !st.IPv4.Accepts || st.IPv4.Policy != "DROP" || !st.IPv4.Forwarding || !st.IPv4.SetForwarding {
		t.Errorf("IPv4 status %+v: want the accepts, policy DROP, forwarding turned on", st.IPv4)
	}
	if got := sysctl("ipv4/ip_forward", ""); got != "1" {
		t.Errorf("net.ipv4.ip_forward %s after Sync, want 1", got)
	}
	for _, c := range [][2]*netnodes.Pod{{a, b}, {b, a}} {
		to := netip.AddrPortFrom(c[1].Addrs[0], 7000)
		if src, err := c[0].SourceSeen(to); err != nil || src != c[0].Addrs[0] {
			t.Errorf("%s -> %s through FORWARD DROP: source %v, %v; want %v", c[0].Name, to, src, err, c[0].Addrs[0])
		}
	}
	rules := iptables("-S")
	for _, want := range []string{
		"-P FORWARD DROP",
		"-N IPLEDGER-FWD",
		"-A FORWARD -s 192.0.2.1/32 -j DROP\n-A FORWARD -j IPLEDGER-FWD",
		"-A IPLEDGER-FWD -s 10.244.0.0/16 -j ACCEPT\n-A IPLEDGER-FWD -d 10.244.0.0/16 -j ACCEPT",
	} {
		if !strings.Contains(rules, want) {
			t.Errorf("iptables -S does not show %q:\n%s", want, rules)
		}
	}
	if strings.Contains(rules, "unsupported") || strings.Contains(rules, "Warning") {
		t.Errorf("iptables -S cannot read the rules:\n%s", rules)
	}
	if _, err := f.Sync(pods); err != nil {
		t.Fatal(err)
	}
	if again := iptables("-S"); again != rules {
		t.Errorf("second Sync changed the rules:\n%s\nwas:\n%s", again, rules)
	}

	removed, err := f.Remove()
	if err != nil || !removed {
		t.Fatalf("Remove: %v, %v", removed, err)
	}
	if got := iptables("-S"); strings.Contains(got, "IPLEDGER") || !strings.Contains(got, "-A FORWARD -s 192.0.2.1/32 -j DROP") {
		t.Errorf("after Remove:\n%s\nwant ipledger's rules gone, the operator's kept", got)
	}
	if _, err := a.SourceSeen(netip.MustParseAddrPort("10.244.1.3:7000")); err == nil {
		t.Error("after Remove, pod a still reaches pod b through FORWARD DROP")
	}
	if removed, err := f.Remove(); err != nil || removed {
		t.Errorf("second Remove: %v, %v; want nothing to remove", removed, err)
	}
}
