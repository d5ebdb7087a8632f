package cniplugin

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// validName is the spec's rule for container IDs and network names:
// ^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$ (checked by hand: the library's regexp is most of its
// package init).
func validName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '.' && c != '-') {
			return false
		}
	}
	return s != ""
}

// ValidateContainerID checks CNI_CONTAINERID.
func ValidateContainerID(id string) *Error {
	if id == "" {
		return NewError(ErrUnknownContainer, "missing containerID", "")
	}
	if !validName(id) {
		return NewError(ErrInvalidEnvironmentVariables, "invalid characters in containerID", id)
	}
	return nil
}

// ValidateNetworkName checks a configuration's name.
func ValidateNetworkName(name string) *Error {
	if name == "" {
		return NewError(ErrInvalidNetworkConfig, "missing network name:", "")
	}
	if !validName(name) {
		return NewError(ErrInvalidNetworkConfig, "invalid characters found in network name", name)
	}
	return nil
}

// maxIfName is the kernel's limit on an interface name (IFNAMSIZ less the NUL).
const maxIfName = 15

// ValidateInterfaceName checks CNI_IFNAME as the kernel would: not empty, at most 15
// bytes, not "." or "..", and no '/', ':' or white space.
func ValidateInterfaceName(name string) *Error {
	if name == "" {
		return NewError(ErrInvalidEnvironmentVariables, "interface name is empty", "")
	}
	if len(name) > maxIfName {
		return NewError(ErrInvalidEnvironmentVariables, "interface name is too long", fmt.Sprintf("interface name should be less than %d characters", maxIfName+1))
	}
	if name == "." || name == ".." {
		return NewError(ErrInvalidEnvironmentVariables, "interface name is . or ..", "")
	}
	for i := 0; i < len(name); {
		r, size := utf8.DecodeRuneInString(name[i:])
		if r == '/' || r == ':' || unicode.IsSpace(r) {
			return NewError(ErrInvalidEnvironmentVariables, "interface name contains / or : or whitespace characters", "")
		}
		i += size
	}
	return nil
}

// ParseVersion splits a spec version "major[.minor[.micro]]"; "" is 0.1.0 (a
// configuration without a cniVersion).
func ParseVersion(v string) (major, minor, micro int, err error) {
	if v == "" {
		return 0, 1, 0, nil
	}
	parts := strings.Split(v, ".")
	if len(parts) >= 4 {
		return -1, -1, -1, fmt.Errorf("invalid version %q: too many parts", v)
	}
	nums := [3]int{}
	names := [3]string{"major", "minor", "micro"}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			return -1, -1, -1, fmt.Errorf("failed to convert %s version part %q: %w", names[i], p, err)
		}
		nums[i] = n
	}
	return nums[0], nums[1], nums[2], nil
}

// AtLeast reports whether spec version a is b or newer.
func AtLeast(a, b string) (bool, error) {
	a1, a2, a3, err := ParseVersion(a)
	if err != nil {
		return false, err
	}
	b1, b2, b3, err := ParseVersion(b)
	if err != nil {
		return false, err
	}
	if a1 != b1 {
		return a1 > b1, nil
	}
	if a2 != b2 {
		return a2 > b2, nil
	}
	return a3 >= b3, nil
}
