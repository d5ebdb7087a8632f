package choice

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParseIP(t *testing.T) {
	src := PodSource("team-b", "web-0")
	for _, c := range []struct {
		in   string
		want []string
		says string // in the error; "" when it parses
	}{
		{"10.0.5.7", []string{"10.0.5.7"}, ""},
		{" 10.0.5.7 , fd00::5:7", []string{"10.0.5.7", "fd00::5:7"}, ""},
		{"fd00::5:7", []string{"fd00::5:7"}, ""},
		{"", nil, `"" is not an IPv4 or IPv6 address`},
		{"10.0.5", nil, `"10.0.5" is not`},
		{"10.0.5.7/24", nil, "is not an IPv4"},
		{"10.0.5.7,10.0.5.8", nil, "two addresses of one family"},
		{"10.0.5.7,fd00::1,fd00::2", nil, "one IPv4 and one IPv6"},
		{"fe80::1%eth0", nil, "is not an IPv4"},
		{"::ffff:10.0.5.7", nil, "is not an IPv4"},
		{"224.0.0.1", nil, "not a unicast"},
		{"127.0.0.1", nil, "not a unicast"},
	} {
		got, err := ParseIP(c.in, src)
		if c.says == "" {
			if err != nil || !slices.Equal(got, addrs(c.want)) {
				t.Errorf("ParseIP(%q) = %v, %v; want %v", c.in, got, err, c.want)
			}
			continue
		}
		if !errors.Is(err, ErrBadAnnotation) || !strings.Contains(err.Error(), c.says) ||
			!strings.Contains(err.Error(), "ipledger.io/ip on pod team-b/web-0") {
			t.Errorf("ParseIP(%q) = %v, %v; want ErrBadAnnotation naming the annotation, the pod and saying %q", c.in, got, err, c.says)
		}
	}
}

func TestParsePool(t *testing.T) {
	src := NamespaceSource("team-b")
	for _, c := range []struct {
		in, want string
	}{
		{"blue", "blue"}, {" blue-2 ", "blue-2"}, {"0a", "0a"},
		{"", ""}, {"Blue", ""}, {"-blue", ""}, {"blue-", ""}, {"blue.x", ""}, {strings.Repeat("a", 64), ""},
	} {
		got, err := ParsePool(c.in, src)
		if c.want != "" {
			if err != nil || got != c.want {
				t.Errorf("ParsePool(%q) = %q, %v; want %q", c.in, got, err, c.want)
			}
			continue
		}
		if !errors.Is(err, ErrBadAnnotation) || !strings.Contains(err.Error(), "ipledger.io/pool on namespace team-b") {
			t.Errorf("ParsePool(%q) = %q, %v; want ErrBadAnnotation naming the annotation and the namespace", c.in, got, err)
		}
	}
}

func addrs(ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// FuzzParse: whatever a user writes, the parsers either refuse it with
// ErrBadAnnotation or return what the ledger accepts: at most one address per
// family, each a valid unicast address without zone; a pool name that is a DNS label.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"10.0.5.7", "10.0.5.7,fd00::5:7", "blue", "", ",", "fe80::1%x", "::ffff:1.2.3.4", "a-b", "1.2.3.4,1.2.3.4"} {
		f.Add(s)
	}
	src := PodSource("ns", "p")
	f.Fuzz(func(t *testing.T, v string) {
		as, err := ParseIP(v, src)
		if err != nil {
			if !errors.Is(err, ErrBadAnnotation) || as != nil {
				t.Fatalf("ParseIP(%q): %v, %v", v, as, err)
			}
		} else {
			if len(as) == 0 || len(as) > 2 || len(as) == 2 && as[0].BitLen() == as[1].BitLen() {
				t.Fatalf("ParseIP(%q) = %v", v, as)
			}
			for _, a := range as {
				if !a.IsValid() || a.Zone() != "" || a.Is4In6() || a.IsMulticast() || a.IsLoopback() {
					t.Fatalf("ParseIP(%q) = %v", v, as)
				}
			}
		}
		name, err := ParsePool(v, src)
		if err != nil {
			if !errors.Is(err, ErrBadAnnotation) || name != "" {
				t.Fatalf("ParsePool(%q): %q, %v", v, name, err)
			}
			return
		}
		if name == "" || len(name) > MaxPoolName || name[0] == '-' || name[len(name)-1] == '-' || strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
			t.Fatalf("ParsePool(%q) = %q", v, name)
		}
	})
}
