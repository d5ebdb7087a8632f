package pool

import (
	"fmt"
	"net/netip"
)

// ParseAddrOrCIDR reads an address (10.0.0.5, fd00::5: the prefix of that one
// address) or a CIDR without host bits (10.0.0.16/28), as the conflist's
// ipam.exclude and an IPReservation's spec.addresses give them. An IPv4-mapped
// IPv6 address is read as its IPv4 address; a CIDR of them is refused. The error
// says what to write instead.
func ParseAddrOrCIDR(s string) (netip.Prefix, error) {
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not an address or a CIDR; give e.g. \"10.0.0.5\" or \"10.0.0.16/28\"", s)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%q is an IPv4-mapped IPv6 CIDR; give the IPv4 CIDR", s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("%q has host bits set; give %q (or the address alone)", s, p.Masked().String())
	}
	return p, nil
}
