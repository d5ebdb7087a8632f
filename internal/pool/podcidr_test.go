package pool

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestPodCIDRPlaceholders(t *testing.T) {
	v4 := netip.MustParsePrefix("10.244.1.0/24")
	v6 := netip.MustParsePrefix("fd00:244:1::/64")
	for _, tc := range []struct {
		name, ranges string
		podCIDRs     []netip.Prefix
		parseErr     string // substring; empty: parses
		resolveErr   error  // errors.Is target; nil: resolves
		want         string // SetsString of the resolved pool
	}{
		{name: "v4", ranges: `[[{"subnet":"usePodCidr"}]]`, podCIDRs: []netip.Prefix{v4}, want: "10.244.1.0/24"},
		{name: "dual", ranges: `[[{"subnet":"usePodCidr"}],[{"subnet":"usePodCidrIPv6"}]]`, podCIDRs: []netip.Prefix{v6, v4}, want: "10.244.1.0/24"},
		{name: "with a concrete set", ranges: `[[{"subnet":"usePodCidr"}],[{"subnet":"fd00:9::/64"}]]`, podCIDRs: []netip.Prefix{v4}, want: "10.244.1.0/24"},
		{name: "no podCIDR yet", ranges: `[[{"subnet":"usePodCidr"}]]`, resolveErr: ErrNoPodCIDR},
		{name: "no v6 podCIDR", ranges: `[[{"subnet":"usePodCidrIPv6"}]]`, podCIDRs: []netip.Prefix{v4}, resolveErr: ErrNoPodCIDR},
		{name: "overlaps a concrete range", ranges: `[[{"subnet":"usePodCidr"}],[{"subnet":"10.244.1.128/25"}]]`, podCIDRs: []netip.Prefix{v4}, resolveErr: ErrInvalidRange},
		{name: "with rangeStart", ranges: `[[{"subnet":"usePodCidr","rangeStart":"10.0.0.5"}]]`, parseErr: "takes no rangeStart"},
		{name: "shares a set", ranges: `[[{"subnet":"usePodCidr"},{"subnet":"10.9.0.0/24"}]]`, parseErr: "only range of its range set"},
		{name: "twice", ranges: `[[{"subnet":"usePodCidr"}],[{"subnet":"usePodCidr"}]]`, parseErr: "two range sets"},
		{name: "broken concrete set", ranges: `[[{"subnet":"usePodCidr"}],[{"subnet":"10.9.0.1/24"}]]`, parseErr: "host bits"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sets, err := ParseRangeSets([]byte(tc.ranges))
			if tc.parseErr != "" {
				if err == nil || !errors.Is(err, ErrInvalidRange) || !strings.Contains(err.Error(), tc.parseErr) {
					t.Fatalf("ParseRangeSets: %v, want an ErrInvalidRange saying %q", err, tc.parseErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !HasPodCIDR(sets) {
				t.Fatal("HasPodCIDR: false")
			}
			if err := Validate(sets); err == nil || !strings.Contains(err.Error(), "--node-name") {
				t.Fatalf("Validate of a placeholder: %v, want a refusal naming --node-name", err)
			}
			got, err := Resolve(sets, tc.podCIDRs)
			if tc.resolveErr != nil {
				if !errors.Is(err, tc.resolveErr) {
					t.Fatalf("Resolve: %v, want %v", err, tc.resolveErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if HasPodCIDR(got) || Validate(got) != nil {
				t.Fatalf("Resolve gave %v", got)
			}
			if s := got[0].String(); !strings.Contains(s, tc.want) {
				t.Fatalf("resolved first set %s, want %s", s, tc.want)
			}
			if HasPodCIDR(sets) == false {
				t.Fatal("Resolve changed its input")
			}
		})
	}
}
