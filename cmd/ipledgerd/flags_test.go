package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/clusterconf"
)

func noEnv(string) string { return "" }

// TestBadFlags: each bad flag, or bad combination of cluster-mode flags, is refused
// with a message naming the flag and the fix.
func TestBadFlags(t *testing.T) {
	etcd := []string{"--datastore", "etcd", "--etcd-endpoints", "http://127.0.0.1:2379", "--node-name", "node-a"}
	kube := []string{"--datastore", "kubernetes", "--node-name", "node-a"}
	with := func(base []string, more ...string) []string { return append(append([]string{}, base...), more...) }
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--reconcile-interval", "0s"}, "--reconcile-interval: must be positive"},
		{[]string{"--release-grace", "-1s"}, "--release-grace: must be positive"},
		{[]string{"--reuse-delay", "-1s"}, "--reuse-delay: must not be negative"},
		{[]string{"--release-grace", "2m", "--stranded-grace", "1m"}, "raise --stranded-grace"},
		{[]string{"extra"}, "unexpected arguments"},
		// cluster-mode flags without cluster mode
		{[]string{"--etcd-endpoints", "http://127.0.0.1:2379"}, "--etcd-endpoints: only for cluster mode; add --datastore"},
		{[]string{"--kubeconfig", "/k"}, "--kubeconfig: the Kubernetes features of node mode need this node's name; add --node-name"},
		{[]string{"--node-name", "Node_A"}, `--node-name "Node_A": character 'N'`},
		{[]string{"--kube-namespace", "x", "--node-name", "a"}, "--kube-namespace: only for --datastore kubernetes"},
		{[]string{"--block-grace", "1m"}, "--block-grace: only for cluster mode"},
		// node network
		{[]string{"--routes=false"}, "--routes: the node network needs the Nodes; add --node-name"},
		{[]string{"--non-masquerade-cidrs", "10.0.0.0/8"}, "--non-masquerade-cidrs: the node network needs the Nodes"},
		{[]string{"--node-name", "a", "--non-masquerade-cidrs", "10.0.0.1/8"}, "10.0.0.1/8 has host bits set; use 10.0.0.0/8"},
		{[]string{"--node-name", "a", "--non-masquerade-cidrs", "ten"}, `"ten" is not a CIDR`},
		{[]string{"--node-name", "a", "--masquerade=false", "--non-masquerade-cidrs", "10.0.0.0/8"}, "has no effect with --masquerade=false"},
		{[]string{"--node-name", "a", "--node-network-resync", "0s"}, "--node-network-resync: must be positive"},
		{[]string{"--node-name", "a", "--node-ip", "10.0.0.11"}, "--node-ip: published with the node lease of cluster mode"},
		{with(etcd, "--node-ip", "10.0.0.11,10.0.0.12"), "at most one address per family"},
		{with(etcd, "--node-ip", "node-a"), `"node-a" is not an IP address`},
		{with(etcd, "--masquerade=false", "--non-masquerade-cidrs", "10.0.0.0/8"), "has no effect with --masquerade=false"},
		{[]string{"--datastore", "consul", "--node-name", "a"}, `--datastore "consul": use kubernetes, etcd or none`},
		// etcd
		{[]string{"--datastore", "etcd", "--node-name", "a"}, "--datastore etcd: needs --etcd-endpoints"},
		{with(etcd, "--etcd-endpoints", "127.0.0.1:2379"), `--etcd-endpoints: "127.0.0.1:2379" is not a URL; write it as https://HOST:PORT`},
		{with(etcd, "--etcd-cert", "/c.pem"), "--etcd-cert and --etcd-key: give both"},
		{with(etcd, "--etcd-key", "/k.pem"), "--etcd-cert and --etcd-key: give both"},
		{with(etcd, "--kubeconfig", "/k"), "--kubeconfig: only for --datastore kubernetes"},
		{[]string{"--datastore", "etcd", "--etcd-endpoints", "http://127.0.0.1:2379"}, "--node-name: cluster mode (--datastore etcd) needs this node's name; pass --node-name or set NODE_NAME"},
		// kubernetes
		{with(kube, "--etcd-ca", "/ca.pem"), "--etcd-ca: only for --datastore etcd"},
		{[]string{"--datastore", "kubernetes"}, "--node-name: cluster mode (--datastore kubernetes) needs this node's name"},
		{with(kube, "--node-name", "Node_A"), `--node-name "Node_A": character 'N'`},
		{with(kube, "--node-name", "-a"), "must start and end with a letter or digit"},
		// timings
		{with(kube, "--node-lease-ttl", "1s"), "--node-lease-ttl 1s: at least 2s"},
		{with(kube, "--block-grace", "0s"), "--block-grace: must be positive"},
		{with(kube, "--node-lease-ttl", "30s", "--reclaim-quarantine", "20s"), "raise --reclaim-quarantine"},
	} {
		var stderr strings.Builder
		if _, err := parse(c.args, noEnv, &stderr); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parse %q: %v, want an error with %q", c.args, err, c.want)
		}
	}
	if o, err := parse(nil, noEnv, io.Discard); err != nil || o.cluster.Cluster() {
		t.Errorf("defaults refused or not node mode: %v", err)
	}
}

// TestClusterFlags: good cluster-mode settings are accepted; --node-name defaults to
// NODE_NAME; the timings default to the documented values.
func TestClusterFlags(t *testing.T) {
	env := func(k string) string {
		if k == "NODE_NAME" {
			return "worker-1.example"
		}
		return ""
	}
	o, err := parse([]string{"--datastore", "etcd", "--etcd-endpoints", "https://10.0.0.1:2379, https://10.0.0.2:2379", "--etcd-cert", "/c", "--etcd-key", "/k", "--etcd-ca", "/ca"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := o.cluster
	if !c.Cluster() || c.NodeName != "worker-1.example" || len(c.EtcdEndpoints) != 2 || c.EtcdEndpoints[1] != "https://10.0.0.2:2379" {
		t.Errorf("etcd settings: %+v", c)
	}
	if c.LeaseTTL != clusterconf.DefaultLeaseTTL || c.Quarantine != clusterconf.DefaultQuarantine || c.BlockGrace != clusterconf.DefaultBlockGrace {
		t.Errorf("timings %v %v %v, want the defaults", c.LeaseTTL, c.Quarantine, c.BlockGrace)
	}
	if c.LeaseTTL+c.Quarantine > 90*time.Second {
		t.Errorf("a dead node's blocks wait %v (TTL + quarantine), more than the 90s the design promises", c.LeaseTTL+c.Quarantine)
	}
	if !c.LeaseNodes() || !o.network.Enabled(true) || o.network.NodeIPs != nil {
		t.Errorf("etcd: the node network from the node leases, routes %v, masquerade %v, node IPs %v (want the default route's)", o.network.Routes, o.network.Masquerade, o.network.NodeIPs)
	}
	o, err = parse([]string{"--datastore", "etcd", "--etcd-endpoints", "http://127.0.0.1:2379", "--node-name", "n1", "--node-ip", "10.0.0.11,fd00::11", "--routes=false", "--masquerade=false"}, noEnv, io.Discard)
	if err != nil || len(o.network.NodeIPs) != 2 || o.network.NodeIPs[1].String() != "fd00::11" || o.network.Enabled(true) {
		t.Errorf("etcd with --node-ip, --routes=false, --masquerade=false: %+v %v", o, err)
	}
	o, err = parse([]string{"--datastore", "kubernetes", "--node-name", "n1", "--node-lease-ttl", "3s", "--reclaim-quarantine", "3s", "--block-grace", "2s"}, noEnv, io.Discard)
	if err != nil || o.cluster.NodeName != "n1" || o.cluster.Kubeconfig != "" || o.cluster.LeaseTTL != 3*time.Second {
		t.Errorf("kubernetes settings: %+v %v", o, err)
	}
}

// TestInstallCNIFlags: install-cni refuses stray arguments and reports a
// failed install with exit status 1 and the reason on stderr.
func TestInstallCNIFlags(t *testing.T) {
	var out, errb strings.Builder
	if code := installCNI([]string{"extra"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "unexpected arguments") {
		t.Errorf("stray argument: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	dir := t.TempDir()
	if code := installCNI([]string{"--conflist", dir + "/absent", "--cni-bin-dir", dir, "--cni-conf-dir", dir, "--cri-endpoint", ""}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "conflist") {
		t.Errorf("missing conflist: exit %d, stderr %q", code, errb.String())
	}
}

// TestUninstallCNIFlags: uninstall-cni refuses stray arguments and a bad conf
// name, and undoes install-cni: the conflist and the plugins install-cni
// installed go, the node's own portmap and the ledger stay. Run again, or on
// directories where nothing was installed, it exits 1 naming what it did not find.
func TestUninstallCNIFlags(t *testing.T) {
	var out, errb strings.Builder
	if code := uninstallCNI([]string{"extra"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "unexpected arguments") {
		t.Errorf("stray argument: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	dir := t.TempDir()
	if code := uninstallCNI([]string{"--network=false", "--cni-bin-dir", dir, "--cni-conf-dir", dir, "--conf-name", "x.json"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "conf name") {
		t.Errorf("bad conf name: exit %d, stderr %q", code, errb.String())
	}

	for _, nodeHasPortmap := range []bool{false, true} {
		t.Run(fmt.Sprintf("node-has-portmap=%v", nodeHasPortmap), func(t *testing.T) {
			d := t.TempDir()
			src, bin, confd, state := filepath.Join(d, "src"), filepath.Join(d, "bin"), filepath.Join(d, "net.d"), filepath.Join(d, "var-lib-ipledger")
			files := map[string]string{
				filepath.Join(src, "ipledger"): "ipledger", filepath.Join(src, "ipledger-veth"): "ipledger-veth", filepath.Join(src, "portmap"): "portmap",
				filepath.Join(d, "conflist"):      `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ipledger-veth","ipam":{"type":"ipledger"}},{"type":"portmap","capabilities":{"portMappings":true},"snat":true}]}`,
				filepath.Join(state, "ledger.db"): "the ledger",
			}
			if nodeHasPortmap {
				files[filepath.Join(bin, "portmap")] = "the node's portmap"
			}
			for p, data := range files {
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(data), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for _, dir := range []string{bin, confd} {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			dirs := []string{"--cni-bin-dir", bin, "--cni-conf-dir", confd}
			var out, errb strings.Builder
			if code := installCNI(append([]string{"--src-dir", src, "--conflist", filepath.Join(d, "conflist"), "--cri-endpoint", ""}, dirs...), &out, &errb); code != 0 {
				t.Fatalf("install-cni: exit %d, stderr %q", code, errb.String())
			}
			if got := strings.Contains(out.String(), "kept portmap"); got != nodeHasPortmap {
				t.Errorf("install-cni output %q: kept portmap %v, want %v", out.String(), got, nodeHasPortmap)
			}
			out.Reset()
			// --network=false: this test runs in the host's namespace, whose routes
			// and rules are not the test's (TestUninstallRemovesTheNodeNetwork runs
			// the network part in a namespace of its own)
			if code := uninstallCNI(append([]string{"--network=false"}, dirs...), &out, &errb); code != 0 {
				t.Fatalf("uninstall-cni: exit %d, stderr %q", code, errb.String())
			}
			t.Logf("uninstall-cni:\n%s", out.String())
			for _, p := range []string{filepath.Join(confd, "10-ipledger.conflist"), filepath.Join(bin, "ipledger"), filepath.Join(bin, "ipledger-veth")} {
				if !strings.Contains(out.String(), "removed "+p+"\n") {
					t.Errorf("uninstall-cni did not report removing %s", p)
				}
				if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s still there (%v)", p, err)
				}
			}
			b, err := os.ReadFile(filepath.Join(bin, "portmap"))
			if nodeHasPortmap != (err == nil) || (err == nil && string(b) != "the node's portmap") {
				t.Errorf("portmap after uninstall: %q %v (the node had its own: %v)", b, err, nodeHasPortmap)
			}
			if b, err := os.ReadFile(filepath.Join(state, "ledger.db")); err != nil || string(b) != "the ledger" {
				t.Errorf("ledger after uninstall: %q %v", b, err)
			}
			if ents, _ := os.ReadDir(confd); len(ents) != 0 {
				t.Errorf("conf dir after uninstall holds %v", ents)
			}
			// again, or with dirs where nothing was installed: exit 1 naming what
			// it did not find, never a silent success
			for _, dirs := range [][]string{dirs, {"--cni-bin-dir", filepath.Join(d, "host", "opt", "cni", "bin"), "--cni-conf-dir", filepath.Join(d, "host", "etc", "cni", "net.d")}} {
				out.Reset()
				errb.Reset()
				code := uninstallCNI(append([]string{"--network=false"}, dirs...), &out, &errb)
				conflist, plugin := filepath.Join(dirs[3], "10-ipledger.conflist"), filepath.Join(dirs[1], "ipledger-veth")
				if code != 1 || !strings.Contains(errb.String(), "not found") || !strings.Contains(errb.String(), conflist) || !strings.Contains(errb.String(), plugin) {
					t.Errorf("uninstall-cni %q with nothing there: exit %d, stderr %q; want 1 naming %s and %s", dirs, code, errb.String(), conflist, plugin)
				}
			}
		})
	}
}

// TestConflistFlag: --conflist is read and checked at start as an ADD's config is
// in cluster mode; each bad file is refused naming the flag, the field and the fix.
func TestConflistFlag(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	conf := func(ranges string, blockSize int) string {
		return fmt.Sprintf(`{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"ipledger-veth","ipam":{"type":"ipledger","blockSize":%d,"ranges":%s}},{"type":"portmap"}]}`, blockSize, ranges)
	}
	etcd := []string{"--datastore", "etcd", "--etcd-endpoints", "http://127.0.0.1:2379", "--node-name", "node-a"}
	good := file("good.conflist", conf(`[[{"subnet":"10.244.0.0/16"}],[{"subnet":"fd00:10:244::/56"}]]`, 0))
	o, err := parse(append(etcd, "--conflist", good), noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if p := o.prepare; p == nil || p.network != "k8s-pod-network" || len(p.ranges) != 2 || fmt.Sprint(p.bits) != "[26 122]" {
		t.Fatalf("prepared %+v, want k8s-pod-network, two range sets, blocks /26 and /122", p)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--conflist", good}, "--conflist: only cluster mode (--datastore) claims blocks; remove the flag in node mode"},
		{append(etcd, "--conflist", filepath.Join(dir, "none")), "--conflist: open " + filepath.Join(dir, "none") + ": no such file or directory; give the conflist the node's pods use"},
		{append(etcd, "--conflist", file("bridge", `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge","ipam":{"type":"host-local"}}]}`)), `no plugin with "ipam": {"type": "ipledger"}`},
		{append(etcd, "--conflist", file("podcidr", conf(`[[{"subnet":"usePodCidr"}]]`, 0))), "ipam.ranges: usePodCidr is for node mode"},
		{append(etcd, "--conflist", file("bits", conf(`[[{"subnet":"10.244.0.0/24"}]]`, 31))), "blockSize: /31 blocks for the IPv4 range set 10.244.0.0/24(10.244.0.1-10.244.0.254); use a prefix length from 16 to 30"},
		{append(etcd, "--conflist", file("json", `{"name":`)), "not a network config list"},
	} {
		if _, err := parse(c.args, noEnv, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parse %q: %v, want an error with %q", c.args, err, c.want)
		}
	}
}
