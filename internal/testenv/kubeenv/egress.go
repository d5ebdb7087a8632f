package kubeenv

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// The apiserver of StartControlPlane runs on the host's loopback, but the
// kubelets and pods it must reach (kubectl logs, exec, port-forward, the pod
// and service proxies) live in the nodes' namespaces, which the host has no
// route to. Its "cluster" egress therefore goes through an HTTP CONNECT proxy
// on a unix socket (the apiserver's egress selector, as konnectivity serves
// it) that dials from inside a node's namespace: the node whose address is the
// target, else the first node, whose routes reach every pod. The host's own
// routes never carry the test's traffic.

// egressConfig is the apiserver's --egress-selector-config-file for sock.
func egressConfig(sock string) string {
	return fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %s
`, sock)
}

// startEgress listens on the cluster's egress socket and writes the egress
// selector configuration; it returns the configuration's path. Stopped at
// cleanup.
func (c *Cluster) startEgress() (string, error) {
	sock := filepath.Join(c.Dir, "egress.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return "", err
	}
	cfg := filepath.Join(c.Dir, "egress-selector.yaml")
	if err := os.WriteFile(cfg, []byte(egressConfig(sock)), 0o644); err != nil {
		ln.Close()
		return "", err
	}
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	track := func(cs ...net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		if conns == nil {
			return false
		}
		for _, x := range cs {
			conns[x] = true
		}
		return true
	}
	c.tb.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for x := range conns {
			x.Close()
		}
		conns = nil
	})
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go c.egressConn(in, track)
		}
	}()
	return cfg, nil
}

// egressConn serves one CONNECT: dial the target from a node's namespace,
// answer 200 and splice.
func (c *Cluster) egressConn(in net.Conn, track func(...net.Conn) bool) {
	defer in.Close()
	in.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(in)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	in.SetReadDeadline(time.Time{})
	if req.Method != http.MethodConnect {
		fmt.Fprintf(in, "HTTP/1.1 405 Method Not Allowed\r\n\r\n")
		return
	}
	target := req.Host
	n := c.egressNode(target)
	if n == nil {
		fmt.Fprintf(in, "HTTP/1.1 503 Service Unavailable\r\n\r\nno node to dial %s from\n", target)
		return
	}
	out, err := n.Host.Dial("tcp", target, 10*time.Second)
	if err != nil {
		fmt.Fprintf(in, "HTTP/1.1 502 Bad Gateway\r\n\r\n%s: dial %s: %v\n", n.Name, target, err)
		return
	}
	defer out.Close()
	if !track(in, out) {
		return
	}
	if _, err := fmt.Fprintf(in, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { io.Copy(out, br); done <- struct{}{} }()
	go func() { io.Copy(in, out); done <- struct{}{} }()
	<-done
}

// egressNode is the node to dial target (host:port) from.
func (c *Cluster) egressNode(target string) *Node {
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return nil
	}
	c.nodesMu.Lock()
	defer c.nodesMu.Unlock()
	for _, n := range c.nodes {
		if n.IP == host {
			return n
		}
	}
	if len(c.nodes) > 0 {
		return c.nodes[0]
	}
	return nil
}
