package cluster_test

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/pool"
)

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// ParseReservation reads an IPReservation's spec: addresses and CIDRs of both
// families and a reason; every refusal wraps ErrBadReservation and names the
// field and the fix, and keeps the entries that parsed.
func TestParseReservation(t *testing.T) {
	for _, c := range []struct {
		name, rname, spec string
		want              []netip.Prefix
		reason            string
		errHas            []string // each in the error; none: no error
	}{
		{name: "both families", rname: "gw", spec: `{"addresses":["10.244.1.2","10.244.1.240/28","fd00:10:244::/120","fd00::5"],"reason":"routers"}`,
			want: prefixes("10.244.1.2/32", "10.244.1.240/28", "fd00:10:244::/120", "fd00::5/128"), reason: "routers"},
		{name: "mapped address is IPv4", rname: "m", spec: `{"addresses":["::ffff:10.0.0.1"]}`, want: prefixes("10.0.0.1/32")},
		{name: "a dotted name", rname: "rack-4.routers", spec: `{"addresses":["10.0.0.1"]}`, want: prefixes("10.0.0.1/32")},
		{name: "missing addresses", rname: "x", spec: `{"reason":"r"}`, reason: "r", errHas: []string{"IPReservation x", "spec.addresses is missing", "give the addresses"}},
		{name: "empty addresses", rname: "x", spec: `{"addresses":[]}`, errHas: []string{"spec.addresses is missing or empty"}},
		{name: "not an address", rname: "x", spec: `{"addresses":["10.0.0.1","10.0.0.300"]}`, want: prefixes("10.0.0.1/32"),
			errHas: []string{"spec.addresses[1]", `"10.0.0.300" is not an address or a CIDR`, "give e.g."}},
		{name: "host bits", rname: "x", spec: `{"addresses":["10.0.0.17/28","fd00::1"]}`, want: prefixes("fd00::1/128"),
			errHas: []string{"spec.addresses[0]", `give "10.0.0.16/28"`}},
		{name: "zone", rname: "x", spec: `{"addresses":["fe80::1%eth0"]}`, errHas: []string{"spec.addresses[0]"}},
		{name: "addresses not a list", rname: "x", spec: `{"addresses":"10.0.0.1"}`, errHas: []string{"IPReservation x: spec:", "list of strings"}},
		{name: "not JSON", rname: "x", spec: `{`, errHas: []string{"IPReservation x: spec:"}},
		{name: "bad name", rname: "Gateways", spec: `{"addresses":["10.0.0.1"]}`, errHas: []string{`IPReservation name "Gateways"`, "DNS subdomain", "rename it"}},
		{name: "reason on two lines", rname: "x", spec: `{"addresses":["10.0.0.1"],"reason":"a\nb"}`, want: prefixes("10.0.0.1/32"),
			errHas: []string{"spec.reason", "one line"}},
		{name: "too many", rname: "x", spec: `{"addresses":[` + strings.Repeat(`"10.0.0.1",`, cluster.MaxReservationAddresses) + `"10.0.0.2"]}`,
			want: slices.Repeat(prefixes("10.0.0.1/32"), cluster.MaxReservationAddresses), errHas: []string{"257 entries, at most 256", "merge addresses into CIDRs"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := cluster.ParseReservation(c.rname, []byte(c.spec))
			if len(c.errHas) == 0 && err != nil {
				t.Fatalf("error %v", err)
			}
			if len(c.errHas) > 0 {
				if !errors.Is(err, cluster.ErrBadReservation) {
					t.Fatalf("error %v, want one wrapping ErrBadReservation", err)
				}
				for _, s := range c.errHas {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q lacks %q", err, s)
					}
				}
			}
			if !slices.Equal(r.Prefixes, c.want) || r.Reason != c.reason || r.Name != c.rname {
				t.Fatalf("read %+v, want prefixes %v reason %q", r, c.want, c.reason)
			}
		})
	}
}

// MarshalReservation writes what ParseReservation reads back.
func TestMarshalReservationRoundTrip(t *testing.T) {
	in := cluster.Reservation{Name: "gw", Prefixes: prefixes("10.0.0.1/32", "10.0.0.16/28", "fd00::/120", "fd00:1::1/128"), Reason: "routers"}
	b, err := cluster.MarshalReservation(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := cluster.ParseReservation("gw", b)
	if err != nil || !slices.Equal(out.Prefixes, in.Prefixes) || out.Reason != in.Reason {
		t.Fatalf("%s read back as %+v (%v)", b, out, err)
	}
	if !strings.Contains(string(b), `"10.0.0.1"`) {
		t.Errorf("%s: a single address is written without its /32", b)
	}
}

// ReservedIn keeps the reserved prefixes that overlap the ranges, each once, and
// Covering names the reservation that holds an address.
func TestReservedIn(t *testing.T) {
	rs := []cluster.Reservation{
		{Name: "a", Prefixes: prefixes("10.0.0.5/32", "192.168.0.0/24", "fd00::/120")},
		{Name: "b", Prefixes: prefixes("10.0.0.0/28", "10.0.0.5/32", "10.0.1.0/24")},
	}
	ranges, err := pool.ParseRangeSets([]byte(`[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64"}]]`))
	if err != nil {
		t.Fatal(err)
	}
	got := cluster.ReservedIn(rs, ranges)
	if want := prefixes("10.0.0.0/28", "fd00::/120"); !slices.Equal(got, want) {
		t.Fatalf("ReservedIn = %v, want %v", got, want)
	}
	if r, ok := cluster.Covering(rs, netip.MustParseAddr("10.0.0.5")); !ok || r.Name != "a" {
		t.Fatalf("Covering(10.0.0.5) = %v %v, want a", r.Name, ok)
	}
	if r, ok := cluster.Covering(rs, netip.MustParseAddr("10.0.0.20")); ok {
		t.Fatalf("Covering(10.0.0.20) = %v, want none", r.Name)
	}
}

// FuzzParseReservation: ParseReservation never panics; without an error every
// entry of spec.addresses is a prefix without host bits, and what it read
// marshals and reads back the same; an error wraps ErrBadReservation and names
// the reservation.
func FuzzParseReservation(f *testing.F) {
	for _, s := range []string{
		`{"addresses":["10.244.1.2","10.244.1.240/28","fd00:10:244::/120"],"reason":"routers"}`,
		`{"addresses":["10.0.0.17/28"]}`, `{"addresses":["::ffff:10.0.0.1"]}`, `{"addresses":[]}`,
		`{"addresses":"x"}`, `{`, `null`, `[]`, `{"addresses":["fe80::1%eth0"],"reason":"\u0000"}`,
	} {
		f.Add("gw", []byte(s))
	}
	f.Fuzz(func(t *testing.T, name string, data []byte) {
		r, err := cluster.ParseReservation(name, data)
		if err != nil {
			if !errors.Is(err, cluster.ErrBadReservation) || !strings.Contains(err.Error(), "IPReservation") {
				t.Fatalf("error %v", err)
			}
		}
		for _, p := range r.Prefixes {
			if !p.IsValid() || p.Masked() != p || p.Addr().Zone() != "" || p.Addr().Is4In6() {
				t.Fatalf("read prefix %v", p)
			}
		}
		if err != nil {
			return
		}
		b, err := cluster.MarshalReservation(r)
		if err != nil {
			t.Fatal(err)
		}
		back, err := cluster.ParseReservation(name, b)
		if err != nil || !slices.Equal(back.Prefixes, r.Prefixes) || back.Reason != r.Reason {
			t.Fatalf("%s read back as %+v (%v), want %+v", b, back, err, r)
		}
	})
}
