package attachment_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/attachment"
)

var errCaller = errors.New("invalid attachment")

// Each refusal wraps the caller's sentinel and names the field and the rule or limit,
// in the words the ledger and the plugins have always used.
func TestValidateKey(t *testing.T) {
	for _, c := range []struct {
		network, containerID, ifName string
		want                         string // "" when the key is valid
	}{
		{"net-1", "c_1.x", "eth0", ""},
		{strings.Repeat("n", attachment.MaxNetworkLen), strings.Repeat("c", attachment.MaxContainerIDLen), strings.Repeat("i", attachment.MaxIfNameLen), ""},
		{"", "c", "eth0", "invalid attachment: network name: empty"},
		{strings.Repeat("n", attachment.MaxNetworkLen+1), "c", "eth0", "invalid attachment: network name: 254 bytes; at most 253"},
		{"-a", "c", "eth0", "invalid attachment: network name: must start with a letter or digit"},
		{"a/b", "c", "eth0", `invalid attachment: network name: byte 1 ('/') is not a letter, digit, '_', '.' or '-'`},
		{"net", "", "eth0", "invalid attachment: CNI_CONTAINERID: empty"},
		{"net", strings.Repeat("c", attachment.MaxContainerIDLen+1), "eth0", "invalid attachment: CNI_CONTAINERID: 1025 bytes; at most 1024"},
		{"net", "c", "", "invalid attachment: CNI_IFNAME: empty; give the interface name, e.g. eth0"},
		{"net", "c", strings.Repeat("i", attachment.MaxIfNameLen+1), "invalid attachment: CNI_IFNAME: 16 bytes; at most 15"},
		{"net", "c", "..", `invalid attachment: CNI_IFNAME: ".." is not allowed`},
		{"net", "c", "a:b", `invalid attachment: CNI_IFNAME: "a:b" holds a character not allowed in an interface name`},
	} {
		err := attachment.ValidateKey(errCaller, c.network, c.containerID, c.ifName)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("key %.8q/%.8q/%q: %v, want valid", c.network, c.containerID, c.ifName, err)
		case c.want != "" && (!errors.Is(err, errCaller) || err.Error() != c.want):
			t.Errorf("key %.8q/%.8q/%q: %v, want the caller's sentinel and %q", c.network, c.containerID, c.ifName, err, c.want)
		}
	}
}
