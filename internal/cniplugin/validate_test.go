package cniplugin

import (
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/containernetworking/cni/pkg/version"
)

func sameError(ours *Error, lib *types.Error) bool {
	if ours == nil || lib == nil {
		return ours == nil && lib == nil
	}
	return ours.Code == lib.Code && ours.Msg == lib.Msg && ours.Details == lib.Details
}

var nameSeeds = []string{"", "a", "eth0", "a b", "-a", "_a", ".a", "a-b.c_D9", "café", "a/b", "a:b", "a\tb", "a\u00a0b", "a\u2003b", ".", "..", "...",
	"abcdefghijklmno", "abcdefghijklmnop", "\xff", "é", "0", "a\x00b", "k8s_POD_default_x_0"}

// checkValidators compares the validators with the library's on s.
func checkValidators(t *testing.T, s string) {
	if got, want := ValidateContainerID(s), utils.ValidateContainerID(s); !sameError(got, want) {
		t.Errorf("ValidateContainerID(%q) = %v, library %v", s, got, want)
	}
	if got, want := ValidateNetworkName(s), utils.ValidateNetworkName(s); !sameError(got, want) {
		t.Errorf("ValidateNetworkName(%q) = %v, library %v", s, got, want)
	}
	if got, want := ValidateInterfaceName(s), utils.ValidateInterfaceName(s); !sameError(got, want) {
		t.Errorf("ValidateInterfaceName(%q) = %v, library %v", s, got, want)
	}
}

func TestValidatorsMatchLibrary(t *testing.T) {
	for _, s := range nameSeeds {
		checkValidators(t, s)
	}
}

func FuzzValidatorsMatchLibrary(f *testing.F) {
	for _, s := range nameSeeds {
		f.Add(s)
	}
	f.Fuzz(checkValidators)
}

var versionSeeds = []string{"", "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", "1.1", "1", "2.0.0", "1.0.0.0", "a", "1.x", "1..0", "-1.0.0", "+1.0.0", "01.0.0", "1.0.0-rc1", " 1.0.0", "99999999999999999999.0.0"}

// checkVersions compares version parsing and ordering with the library's.
func checkVersions(t *testing.T, a, b string) {
	m1, m2, m3, err := ParseVersion(a)
	l1, l2, l3, lerr := version.ParseVersion(a)
	if m1 != l1 || m2 != l2 || m3 != l3 || (err == nil) != (lerr == nil) || err != nil && err.Error() != lerr.Error() {
		t.Errorf("ParseVersion(%q) = %d %d %d %v, library %d %d %d %v", a, m1, m2, m3, err, l1, l2, l3, lerr)
	}
	got, err := AtLeast(a, b)
	want, lerr := version.GreaterThanOrEqualTo(a, b)
	if got != want || (err == nil) != (lerr == nil) || err != nil && err.Error() != lerr.Error() {
		t.Errorf("AtLeast(%q, %q) = %v %v, library %v %v", a, b, got, err, want, lerr)
	}
}

func TestVersionsMatchLibrary(t *testing.T) {
	for _, a := range versionSeeds {
		for _, b := range versionSeeds {
			checkVersions(t, a, b)
		}
	}
}

func FuzzVersionsMatchLibrary(f *testing.F) {
	for _, a := range versionSeeds {
		f.Add(a, "1.0.0")
	}
	f.Fuzz(checkVersions)
}

// FuzzConfigVersion: ConfigVersion and the configuration check agree with the
// library's decoder on any stdin, including the shapes the fast path leaves to
// encoding/json.
func FuzzConfigVersion(f *testing.F) {
	for _, s := range []string{`{"cniVersion":"1.0.0","name":"n"}`, `{}`, `[]`, `null`, `{"cniVersion":1}`, `{"CNIVersion":"0.4.0","cniVersion":"1.0.0"}`, `{"cniVersion":"1.0.0","cniVersion":"0.4.0"}`, `{"cniVersion":"\u0031.0.0"}`, `{"name":"a","Name":"b"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, stdin []byte) {
		got, err := ConfigVersion(stdin)
		want, lerr := (&version.ConfigDecoder{}).Decode(stdin)
		if got != want || (err == nil) != (lerr == nil) || err != nil && err.Error() != lerr.Error() {
			t.Errorf("ConfigVersion(%q) = %q %v, library %q %v", stdin, got, err, want, lerr)
		}
	})
}
