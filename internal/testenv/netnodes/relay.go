package netnodes

import (
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Relay listens on address inside n and joins every connection to a new one
// to target, dialled from the calling process's own (the host's) namespace:
// a port of the host made reachable inside the namespace. It stops, with
// every connection it holds, at tb's cleanup.
func (n *NS) Relay(tb testing.TB, address, target string) error {
	ln, err := n.Listen("tcp", address)
	if err != nil {
		return fmt.Errorf("relay in %s: %w", n.Netns, err)
	}
	serveRelay(tb, ln, target)
	return nil
}

// serveRelay accepts on ln and splices each connection to a new one to
// target until tb's cleanup.
func serveRelay(tb testing.TB, ln net.Listener, target string) {
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	tb.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				out, err := net.DialTimeout("tcp", target, 5*time.Second)
				if err != nil {
					in.Close()
					return
				}
				mu.Lock()
				conns[in], conns[out] = true, true
				mu.Unlock()
				done := make(chan struct{}, 2)
				go func() { io.Copy(out, in); done <- struct{}{} }()
				go func() { io.Copy(in, out); done <- struct{}{} }()
				<-done
				in.Close()
				out.Close()
				mu.Lock()
				delete(conns, in)
				delete(conns, out)
				mu.Unlock()
			}()
		}
	}()
}
