package netenv_test

import (
	"net"
	"os"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// TestNamespace: the namespace is there under its path while the test runs and gone
// after its cleanup; two calls give two namespaces.
func TestNamespace(t *testing.T) {
	var a, b netenv.NS
	t.Run("make", func(t *testing.T) {
		a, b = netenv.Namespace(t, "iplenv"), netenv.Namespace(t, "iplenv")
		if a.Name == b.Name || a.Path != "/run/netns/"+a.Name || !strings.HasPrefix(a.Name, "iplenv") {
			t.Fatalf("namespaces %+v and %+v", a, b)
		}
		for _, ns := range []netenv.NS{a, b} {
			if _, err := os.Stat(ns.Path); err != nil {
				t.Fatal(err)
			}
		}
	})
	for _, ns := range []netenv.NS{a, b} {
		if _, err := os.Stat(ns.Path); !os.IsNotExist(err) {
			t.Errorf("%s after the cleanup: %v", ns.Path, err)
		}
	}
}

// TestFreePorts: the ports differ and can be listened on.
func TestFreePorts(t *testing.T) {
	ports := netenv.FreePorts(t, 3)
	if ports[0] == ports[1] || ports[1] == ports[2] || ports[0] == ports[2] {
		t.Fatalf("ports %v not distinct", ports)
	}
	l, err := net.Listen("tcp", netenv.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if p, err := netenv.FreePort(); err != nil || p == 0 {
		t.Fatalf("FreePort: %d, %v", p, err)
	}
}
