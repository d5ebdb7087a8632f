package main

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/ipledger/ipledger/internal/nodenet/masq"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// TestUninstallRemovesTheNodeNetwork: `ipledgerd uninstall-cni`, run in a network
// namespace standing for a node, removes every route of ipledger's protocol and the
// masquerade table and the FORWARD accepts, and leaves another owner's route and
// the FORWARD policy alone.
func TestUninstallRemovesTheNodeNetwork(t *testing.T) {
	bin := agentenv.Bin(t)
	name := netenv.Namespace(t, "ipl-uninst-").Name
	ip := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	ip("-n", name, "route", "add", "blackhole", "10.244.1.0/24", "proto", "201")
	ip("-n", name, "route", "add", "blackhole", "10.244.2.0/24", "proto", "201")
	ip("-n", name, "route", "add", "blackhole", "10.244.3.0/24", "proto", "static")
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	m := masq.New(h)
	if err := m.Sync([]netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Current(); err != nil {
		t.Fatalf("masquerade table not there before: %v", err)
	}
	if out, err := exec.Command("ip", "netns", "exec", name, "iptables-nft", "-P", "FORWARD", "DROP").CombinedOutput(); err != nil {
		t.Fatalf("iptables-nft -P FORWARD DROP: %v\n%s", err, out)
	}
	if st, err := masq.NewForward(h).Sync([]netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}); err != nil || !st.IPv4.Accepts {
		t.Fatalf("forward accepts before: %+v, %v", st, err)
	}
	dir := t.TempDir()
	// what install-cni leaves on a node (uninstall-cni fails when it finds none of it)
	for _, f := range []string{"conf/10-ipledger.conflist", "bin/ipledger", "bin/ipledger-veth"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), []byte("installed"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command("ip", "netns", "exec", name, filepath.Join(bin, "ipledgerd"), "uninstall-cni",
		"--cni-bin-dir", filepath.Join(dir, "bin"), "--cni-conf-dir", filepath.Join(dir, "conf")).CombinedOutput()
	t.Logf("uninstall-cni:\n%s", out)
	if err != nil {
		t.Fatalf("uninstall-cni: %v", err)
	}
	if !strings.Contains(string(out), "removed 2 routes of protocol 201") {
		t.Errorf("uninstall-cni did not report the 2 routes")
	}
	routes := ip("-n", name, "route", "show", "table", "main")
	if strings.Contains(routes, "10.244.1.0/24") || strings.Contains(routes, "10.244.2.0/24") || !strings.Contains(routes, "10.244.3.0/24") {
		t.Errorf("routes after uninstall-cni:\n%s\nwant ipledger's gone and the static one kept", routes)
	}
	if _, err := m.Current(); err == nil {
		t.Error("the masquerade table is still there")
	}
	if !strings.Contains(string(out), "removed the FORWARD accepts") {
		t.Errorf("uninstall-cni did not report the FORWARD accepts")
	}
	if rules, err := exec.Command("ip", "netns", "exec", name, "iptables-nft", "-S").CombinedOutput(); err != nil || strings.Contains(string(rules), masq.ForwardChain) || !strings.Contains(string(rules), "-P FORWARD DROP") {
		t.Errorf("iptables -S after uninstall-cni (%v):\n%s\nwant the accepts gone, the policy kept", err, rules)
	}
}
