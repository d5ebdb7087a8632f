package netnodes_test

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/netnodes"
)

// TestRelay: a process in a node's namespace reaches a port of the host through
// the relay, both ways, and the relay is gone after the cleanup.
func TestRelay(t *testing.T) {
	env := netnodes.New(t, 1)
	node := env.Node(0)
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	go func() {
		for {
			c, err := host.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				c.Write([]byte("host got " + line))
			}()
		}
	}()
	const inside = "127.0.0.1:7443"
	t.Run("relay", func(t *testing.T) {
		if err := node.Relay(t, inside, host.Addr().String()); err != nil {
			t.Fatal(err)
		}
		c, err := node.Dial("tcp", inside, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("ping\n"))
		got, err := bufio.NewReader(c).ReadString('\n')
		if got != "host got ping\n" {
			t.Fatalf("through the relay: %q, %v", got, err)
		}
	})
	if c, err := node.Dial("tcp", inside, 5*time.Second); err == nil {
		c.Close()
		t.Fatal("the relay still listens after its test's cleanup")
	}
}
