// Package attachment holds the rules for the key of a CNI attachment (network name,
// container ID, interface name): the CNI spec's rules and the length limits. The ledger
// (internal/ledger) checks every key it records with them and the plugins
// (internal/api) every key they send or name a spool file after, so that both take and
// refuse the same keys in the same words without the plugins linking the ledger.
//
// Each check wraps the sentinel error its caller passes (ledger.ErrInvalidAttachment,
// api.ErrInvalidAttachment), so that each package's callers test errors.Is against the
// sentinel of the package they call; the message names the field and the limit.
package attachment

import "fmt"

// Limits on a key's fields; longer ones are refused, not truncated.
const (
	MaxNetworkLen     = 253
	MaxContainerIDLen = 1024
	MaxIfNameLen      = 15 // IFNAMSIZ-1
)

// ValidateKey checks a key against the CNI spec's rules (container ID: alphanumeric
// first, then alphanumerics, '_', '.', '-'; ifname: at most 15 bytes, not '.' or '..',
// no '/', ':' or white space), and the length limits. The error wraps invalid.
func ValidateKey(invalid error, network, containerID, ifName string) error {
	if err := ValidateName(invalid, "network name", network, MaxNetworkLen); err != nil {
		return err
	}
	if err := ValidateName(invalid, "CNI_CONTAINERID", containerID, MaxContainerIDLen); err != nil {
		return err
	}
	n := ifName
	switch {
	case n == "":
		return fmt.Errorf("%w: CNI_IFNAME: empty; give the interface name, e.g. eth0", invalid)
	case len(n) > MaxIfNameLen:
		return fmt.Errorf("%w: CNI_IFNAME: %d bytes; at most %d", invalid, len(n), MaxIfNameLen)
	case n == "." || n == "..":
		return fmt.Errorf("%w: CNI_IFNAME: %q is not allowed", invalid, n)
	}
	for _, c := range []byte(n) {
		if c <= ' ' || c == '/' || c == ':' || c >= 0x7f {
			return fmt.Errorf("%w: CNI_IFNAME: %q holds a character not allowed in an interface name", invalid, n)
		}
	}
	return nil
}

// ValidateName checks s, the value of field, against the CNI spec's rule for network
// names and container IDs (alphanumeric first, then alphanumerics, '_', '.', '-') and
// against max bytes. The error wraps invalid.
func ValidateName(invalid error, field, s string, max int) error {
	if s == "" {
		return fmt.Errorf("%w: %s: empty", invalid, field)
	}
	if len(s) > max {
		return fmt.Errorf("%w: %s: %d bytes; at most %d", invalid, field, len(s), max)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i == 0 && !alnum {
			return fmt.Errorf("%w: %s: must start with a letter or digit", invalid, field)
		}
		if !alnum && c != '_' && c != '.' && c != '-' {
			return fmt.Errorf("%w: %s: byte %d (%q) is not a letter, digit, '_', '.' or '-'", invalid, field, i, c)
		}
	}
	return nil
}
