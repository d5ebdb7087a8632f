package cniinstall

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestChooseCNIVersion: auto writes 1.1.0 where the runtime loads it
// (containerd 2.0.1+, CRI-O 1.32+) and 1.0.0 elsewhere; the operator's choice
// wins unless the runtime would refuse it; a runtime too old for any version
// the conflist can have, and a refused choice, are one error naming both.
func TestChooseCNIVersion(t *testing.T) {
	ctd := func(v string) *RuntimeInfo { return &RuntimeInfo{Name: "containerd", Version: v} }
	for _, tc := range []struct {
		choice, own string
		rt          *RuntimeInfo
		want        string
		err         error
		why         []string // substrings of the reason, or of the error
	}{
		{"auto", "1.0.0", ctd("v2.3.7"), "1.1.0", nil, []string{"containerd v2.3.7", "STATUS"}},
		{"", "1.0.0", ctd("v2.0.1"), "1.1.0", nil, nil},
		{"auto", "1.0.0", ctd("v2.0.0"), "1.0.0", nil, []string{"containerd v2.0.0", "1.0.0 at most"}},
		{"auto", "1.1.0", ctd("1.6.20~ds1"), "1.0.0", nil, []string{"1.6.20~ds1"}},
		{"auto", "1.0.0", ctd("v1.7.30"), "1.0.0", nil, nil},
		{"auto", "1.0.0", &RuntimeInfo{Name: "cri-o", Version: "1.32.0"}, "1.1.0", nil, []string{"cri-o 1.32.0"}},
		{"auto", "1.0.0", &RuntimeInfo{Name: "cri-o", Version: "1.31.4"}, "1.0.0", nil, nil},
		{"auto", "1.0.0", &RuntimeInfo{Name: "frakti", Version: "9.9"}, "1.0.0", nil, []string{"frakti 9.9", "not one ipledger knows"}},
		{"auto", "1.0.0", nil, "1.0.0", nil, []string{"not asked"}},
		{"1.0.0", "1.0.0", ctd("v2.3.7"), "1.0.0", nil, []string{"operator's choice"}},
		{"1.1.0", "1.0.0", nil, "1.1.0", nil, []string{"operator's choice"}},
		{"keep", "1.0.0", ctd("v2.3.7"), "1.0.0", nil, []string{"conflist's own"}},
		{"1.1.0", "1.0.0", ctd("1.6.20~ds1"), "", ErrVersionRefused, []string{"cniVersion 1.1.0", "containerd 1.6.20~ds1", "--cni-version 1.0.0"}},
		{"keep", "1.1.0", ctd("v1.7.30"), "", ErrVersionRefused, []string{"cniVersion 1.1.0", "containerd v1.7.30"}},
		{"auto", "1.0.0", ctd("v1.5.18"), "", ErrRuntimeUnsupported, []string{"containerd v1.5.18", "1.6 or later"}},
		{"auto", "1.0.0", ctd("nightly"), "", ErrRuntimeUnsupported, []string{"nightly"}},
		{"0.4.0", "1.0.0", ctd("v2.3.7"), "", ErrBadVersion, []string{`"0.4.0"`, "auto, keep"}},
	} {
		got, why, err := ChooseCNIVersion(tc.choice, tc.own, tc.rt)
		name := tc.choice + "/" + tc.own + "/" + func() string {
			if tc.rt == nil {
				return "not asked"
			}
			return tc.rt.String()
		}()
		if !errors.Is(err, tc.err) || (tc.err == nil && err != nil) {
			t.Errorf("%s: err %v, want %v", name, err, tc.err)
			continue
		}
		text := why
		if err != nil {
			text = err.Error()
			if strings.Contains(text, "\n") {
				t.Errorf("%s: the error is more than one line: %q", name, text)
			}
		}
		if got != tc.want {
			t.Errorf("%s: version %q, want %q (%s)", name, got, tc.want, text)
		}
		for _, w := range tc.why {
			if !strings.Contains(text, w) {
				t.Errorf("%s: %q does not say %q", name, text, w)
			}
		}
	}
}

// TestInstallWritesTheRuntimesVersion: Install writes the chosen cniVersion
// into the installed conflist and keeps the rest of it; a refused choice
// installs nothing.
func TestInstallWritesTheRuntimesVersion(t *testing.T) {
	d := t.TempDir()
	src, bin, confd := filepath.Join(d, "src"), filepath.Join(d, "bin"), filepath.Join(d, "net.d")
	for _, dir := range []string{src, bin, confd} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "ipledger"), []byte("plugin"), 0o755); err != nil {
		t.Fatal(err)
	}
	conflist := filepath.Join(d, "conflist")
	const conf = `{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"ipledger","socket":"/run/ipledger/ipledger.sock"}]}`
	if err := os.WriteFile(conflist, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	o := Options{SrcDir: src, Plugins: []string{"ipledger"}, BinDir: bin, Conflist: conflist, ConfDir: confd, ConfName: "10-ipledger.conflist",
		Runtime: &RuntimeInfo{Name: "containerd", Version: "v2.3.7"}}
	done, err := Install(o)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(confd, "10-ipledger.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if done.CNIVersion != "1.1.0" || got["cniVersion"] != "1.1.0" || got["name"] != "k8s-pod-network" ||
		got["plugins"].([]any)[0].(map[string]any)["socket"] != "/run/ipledger/ipledger.sock" {
		t.Fatalf("installed %s (done %+v)", b, done)
	}

	// containerd 1.6 with an operator's 1.1.0: refused, the 1.1.0 conflist
	// above replaced by nothing.
	if err := os.Remove(filepath.Join(confd, "10-ipledger.conflist")); err != nil {
		t.Fatal(err)
	}
	o.CNIVersion, o.Runtime = "1.1.0", &RuntimeInfo{Name: "containerd", Version: "1.6.20~ds1"}
	if _, err := Install(o); !errors.Is(err, ErrVersionRefused) {
		t.Fatalf("1.1.0 on containerd 1.6: err %v", err)
	}
	if _, err := os.Stat(filepath.Join(confd, "10-ipledger.conflist")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused version was installed: %v", err)
	}
}
