package kubeenv

import (
	"errors"
	"strings"
	"testing"
)

func TestSelectRelease(t *testing.T) {
	for _, tc := range []struct {
		value, want string
		err         bool
	}{
		{"", DefaultVersion, false},
		{"v1.37.2", "v1.37.2", false},
		{" 1.37.2 ", "v1.37.2", false},
		{"v1.36.3", "v1.36.3", false},
		{"1.35", "", true},
		{"latest", "", true},
	} {
		r, err := selectRelease(tc.value)
		if tc.err {
			if !errors.Is(err, ErrUnknownVersion) || !strings.Contains(err.Error(), VersionEnv) || !strings.Contains(err.Error(), "v1.37.2") {
				t.Errorf("%q: %v, want ErrUnknownVersion naming %s and the choices", tc.value, err, VersionEnv)
			}
			continue
		}
		if err != nil || r.Version != tc.want {
			t.Errorf("%q: %+v, %v; want %s", tc.value, r, err, tc.want)
		}
	}
	for _, r := range Releases {
		if r.Staging != "v0."+strings.TrimPrefix(r.Version, "v1.") || r.Etcd == "" || r.CoreDNS == "" || r.Images == (E2EImages{}) {
			t.Errorf("release %s is incomplete: %+v", r.Version, r)
		}
	}
}
