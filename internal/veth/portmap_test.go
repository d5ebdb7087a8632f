package veth_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// netfilterRules is iptables-save and ip6tables-save of the namespace at nsPath,
// or of the test's own namespace (the host's) when nsPath is empty.
func netfilterRules(t *testing.T, nsPath string) string {
	t.Helper()
	var all strings.Builder
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		cmd := exec.Command(save)
		if nsPath != "" {
			cmd = exec.Command("ip", "netns", "exec", filepath.Base(nsPath), save)
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s in %s: %v %s", save, nsPath, err, out)
		}
		all.Write(out)
	}
	return all.String()
}

// podListener listens on port (both families) inside the pod namespace and
// answers each connection with a line naming the pod and the peer it saw.
func podListener(t *testing.T, pod string, port int) {
	t.Helper()
	var ln net.Listener
	inNS(t, pod, func() error {
		var err error
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	})
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "pod %s saw %s\n", filepath.Base(pod), c.RemoteAddr())
			c.Close()
		}
	}()
}

// dialFrom connects from inside the namespace at nsPath to addr and returns the
// line the far end sent.
func dialFrom(t *testing.T, nsPath, addr string) (string, error) {
	t.Helper()
	var c net.Conn
	var dialErr error
	inNS(t, nsPath, func() error {
		c, dialErr = net.DialTimeout("tcp", addr, 3*time.Second)
		return nil
	})
	if dialErr != nil {
		return "", dialErr
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// TestPortmapChained: the standard portmap plugin chained after ipledger-veth
// (the conflist install-cni ships) maps a hostPort of the node to the pod: TCP
// to the node's address and hostPort, from another namespace (PREROUTING) and
// from the node itself (OUTPUT), over IPv4 and IPv6, reaches a listener in the
// pod. portmap finds the pod's addresses through the result's sandbox interface.
// DEL through libcni removes every rule portmap wrote for the container. It runs
// with Debian's portmap and with the one make build builds and the image ships.
// The node, the client and the pod are namespaces the test made: the rules are
// written in the node namespace, never the host's.
func TestPortmapChained(t *testing.T) {
	for _, pm := range []struct{ name, dir string }{
		{"debian", "/usr/lib/cni"},
		{"shipped", portmapDir},
	} {
		t.Run(pm.name, func(t *testing.T) {
			node, client := netenv.Namespace(t, "iplt-pmnode").Path, netenv.Namespace(t, "iplt-pmcl").Path
			// The node's uplink: a veth to the client namespace, with the node's
			// addresses 10.251.0.1 and fd00:251::1.
			ipNS(t, node, "link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns", filepath.Base(client))
			for _, side := range []struct {
				ns, dev, v4, v6 string
			}{{node, "up0", "10.251.0.1/24", "fd00:251::1/64"}, {client, "eth0", "10.251.0.2/24", "fd00:251::2/64"}} {
				ipNS(t, side.ns, "addr", "add", side.v4, "dev", side.dev)
				ipNS(t, side.ns, "addr", "add", side.v6, "dev", side.dev, "nodad")
				ipNS(t, side.ns, "link", "set", side.dev, "up")
				ipNS(t, side.ns, "link", "set", "lo", "up")
			}
			ipNS(t, client, "route", "add", "default", "via", "10.251.0.1")
			ipNS(t, client, "-6", "route", "add", "default", "via", "fd00:251::1")
			inNS(t, node, func() error {
				if err := os.WriteFile("/proc/sys/net/ipv4/conf/up0/forwarding", []byte("1"), 0o644); err != nil {
					return err
				}
				return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644)
			})

			network, cid := "iplt-portmap", "portmap-"+pm.name
			const hostPort, podPort = 18080, 8080
			list := listOf(t, "1.0.0", network,
				map[string]any{"type": pluginType, "ipam": (&hostLocal{dataDir: t.TempDir()}).Section(pool{idx: 0}, true, false)},
				map[string]any{"type": "portmap", "capabilities": map[string]any{"portMappings": true}, "snat": true})
			cni := libcni.NewCNIConfigWithCacheDir([]string{binDir, pm.dir}, t.TempDir(), nil)
			pod := netenv.Namespace(t, "iplt-pmpod").Path
			rt := &libcni.RuntimeConf{ContainerID: cid, NetNS: pod, IfName: "eth0",
				CapabilityArgs: map[string]any{"portMappings": []map[string]any{{"hostPort": hostPort, "containerPort": podPort, "protocol": "tcp"}}}}
			ctx := context.Background()
			deleted := false
			inNS(t, node, func() error {
				r, err := cni.AddNetworkList(ctx, list, rt)
				if err != nil {
					return fmt.Errorf("ADD: %w", err)
				}
				res, err := current.NewResultFromResult(r)
				if err != nil {
					return err
				}
				// What portmap reads: each address on the interface named
				// CNI_IFNAME with the pod's netns as its sandbox.
				for _, ip := range res.IPs {
					if ip.Interface == nil || *ip.Interface >= len(res.Interfaces) {
						return fmt.Errorf("ip %s has no interface index in %+v", ip.Address.String(), res.Interfaces)
					}
					if i := res.Interfaces[*ip.Interface]; i.Name != "eth0" || i.Sandbox != pod {
						return fmt.Errorf("ip %s on interface %+v, want eth0 in sandbox %s", ip.Address.String(), i, pod)
					}
				}
				return nil
			})
			t.Cleanup(func() {
				if !deleted {
					inNS(t, node, func() error { return cni.DelNetworkList(ctx, list, rt) })
				}
			})
			if rules := netfilterRules(t, node); !strings.Contains(rules, cid) {
				t.Fatalf("no rule of portmap names %s after ADD:\n%s", cid, rules)
			}
			if strings.Contains(netfilterRules(t, ""), cid) {
				t.Fatalf("portmap wrote rules for %s into the host's namespace", cid)
			}

			podListener(t, pod, podPort)
			for _, c := range []struct{ from, addr string }{
				{client, fmt.Sprintf("10.251.0.1:%d", hostPort)},
				{client, fmt.Sprintf("[fd00:251::1]:%d", hostPort)},
				{node, fmt.Sprintf("10.251.0.1:%d", hostPort)},
				{node, fmt.Sprintf("[fd00:251::1]:%d", hostPort)},
			} {
				line, err := dialFrom(t, c.from, c.addr)
				if err != nil || !strings.HasPrefix(line, "pod "+filepath.Base(pod)+" ") {
					t.Errorf("from %s to %s: %q %v, want the pod's listener", filepath.Base(c.from), c.addr, line, err)
				} else {
					t.Logf("from %s to %s: %s", filepath.Base(c.from), c.addr, line)
				}
			}
			// The node's port itself is closed: only the mapping reaches the pod.
			if _, err := dialFrom(t, client, fmt.Sprintf("10.251.0.1:%d", hostPort+1)); !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("unmapped port: %v, want connection refused", err)
			}

			inNS(t, node, func() error { return cni.DelNetworkList(ctx, list, rt) })
			deleted = true
			rules := netfilterRules(t, node)
			for _, l := range strings.Split(rules, "\n") {
				if strings.Contains(l, cid) || strings.HasPrefix(l, ":CNI-DN-") {
					t.Errorf("portmap rule left after DEL: %s", l)
				}
			}
		})
	}
}
