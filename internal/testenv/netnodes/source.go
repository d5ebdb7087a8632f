package netnodes

import (
	"fmt"
	"io"
	"net/netip"
	"testing"
	"time"
)

// ServeSource listens on address (e.g. ":8080") inside ns and answers each
// connection with the source address it came from, until tb's cleanup: what a
// test reads to tell a masqueraded connection from one that kept its address.
func ServeSource(tb testing.TB, ns *NS, address string) {
	tb.Helper()
	ln, err := ns.Listen("tcp", address)
	if err != nil {
		tb.Fatalf("netnodes: listen on %s in %s: %v", address, ns.Netns, err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
			_, _ = io.WriteString(c, ap.Addr().Unmap().String())
			c.Close()
		}
	}()
}

// SourceSeen connects from n to a ServeSource listener at to and returns the
// source address the listener saw.
func (n *NS) SourceSeen(to netip.AddrPort) (netip.Addr, error) {
	c, err := n.Dial("tcp", to.String(), 3*time.Second)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("connect %s -> %s: %w", n.Netns, to, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("read from %s: %w", to, err)
	}
	return netip.ParseAddr(string(b))
}
