// Package choice reads the annotations by which users choose a pod's addresses:
// ipledger.io/pool (on a namespace or a pod; the pod's wins) names the pool, and
// ipledger.io/ip (on a pod) asks for one address per family. It parses; what the
// names and addresses mean is the agent's to decide.
package choice

import (
	"fmt"
	"net/netip"
	"strings"
)

// The annotations.
const (
	Pool = "ipledger.io/pool"
	IP   = "ipledger.io/ip"
)

// MaxPoolName bounds a pool's name: a DNS label, as a Kubernetes object name of the
// IPPool resource can be.
const MaxPoolName = 63

// Source says where an annotation was found, for messages and the lease's reason:
// "pod team-b/web-0" or "namespace team-b".
type Source string

// PodSource and NamespaceSource name the objects.
func PodSource(namespace, name string) Source { return Source("pod " + namespace + "/" + name) }
func NamespaceSource(namespace string) Source { return Source("namespace " + namespace) }

// ParsePool checks a pool name given by ipledger.io/pool on src: a DNS label
// (lowercase letters, digits, '-', starting and ending with a letter or digit).
func ParsePool(v string, src Source) (string, error) {
	name := strings.TrimSpace(v)
	if name == "" || len(name) > MaxPoolName {
		return "", fmt.Errorf("%w: %s on %s is %q: give the name of an IPPool (1 to %d characters), or remove the annotation for the default pool", ErrBadAnnotation, Pool, src, clip(v), MaxPoolName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' && i > 0 && i < len(name)-1
		if !ok {
			return "", fmt.Errorf("%w: %s on %s is %q: a pool name is a DNS label (lowercase letters, digits and '-', e.g. blue), the name of an IPPool", ErrBadAnnotation, Pool, src, clip(v))
		}
	}
	return name, nil
}

// ParseIP reads ipledger.io/ip on src: one address, or for dual-stack one IPv4 and
// one IPv6 address separated by a comma ("10.0.5.7" or "10.0.5.7,fd00::5:7").
func ParseIP(v string, src Source) ([]netip.Addr, error) {
	parts := strings.Split(v, ",")
	if len(parts) > 2 {
		return nil, fmt.Errorf("%w: %s on %s is %q: give one address, or one IPv4 and one IPv6 address separated by a comma (10.0.5.7,fd00::5:7)", ErrBadAnnotation, IP, src, clip(v))
	}
	var out []netip.Addr
	for _, p := range parts {
		p = strings.TrimSpace(p)
		a, err := netip.ParseAddr(p)
		if err != nil || a.Zone() != "" || a.Is4In6() {
			return nil, fmt.Errorf("%w: %s on %s is %q: %q is not an IPv4 or IPv6 address; give e.g. 10.0.5.7, or 10.0.5.7,fd00::5:7 for dual-stack", ErrBadAnnotation, IP, src, clip(v), clip(p))
		}
		if !a.IsGlobalUnicast() && !a.IsPrivate() {
			return nil, fmt.Errorf("%w: %s on %s is %q: %s is not a unicast address a pod can have", ErrBadAnnotation, IP, src, clip(v), a)
		}
		for _, b := range out {
			if b.BitLen() == a.BitLen() {
				return nil, fmt.Errorf("%w: %s on %s is %q: two addresses of one family; give at most one IPv4 and one IPv6 address", ErrBadAnnotation, IP, src, clip(v))
			}
		}
		out = append(out, a)
	}
	return out, nil
}

// clip shortens a user's value for a message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
