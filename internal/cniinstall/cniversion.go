package cniinstall

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The cniVersion choices of Options.CNIVersion besides a version.
const (
	// VersionAuto: the newest version ipledger's plugins speak that the
	// node's runtime loads (RuntimeInfo), said in Installed.CNIVersionReason.
	VersionAuto = "auto"
	// VersionKeep: the conflist's own cniVersion, as the ConfigMap has it.
	VersionKeep = "keep"
)

// Versions are the cniVersions install-cni writes: 1.1.0 (STATUS and GC: the
// runtime asks the network whether it is ready) and 1.0.0.
var Versions = []string{"1.1.0", "1.0.0"}

// RuntimeInfo is the node's container runtime as its CRI Version call names
// it (RuntimeName, RuntimeVersion), e.g. containerd v2.3.7.
type RuntimeInfo struct {
	Name, Version string
}

func (r RuntimeInfo) String() string { return r.Name + " " + r.Version }

// maxCNIVersion is the newest cniVersion of Versions that rt loads, with the
// reason. ok is false for a runtime ipledger does not know (any name but
// containerd and cri-o): nothing is known of what it loads.
func maxCNIVersion(rt RuntimeInfo) (max, why string, ok bool, err error) {
	v, perr := parseVersion(rt.Version)
	switch strings.ToLower(rt.Name) {
	case "containerd":
		if perr != nil {
			return "", "", false, fmt.Errorf("%w: %s: version %q: %v", ErrRuntimeUnsupported, rt.Name, rt.Version, perr)
		}
		switch {
		case v.less(1, 6, 0):
			return "", "", false, fmt.Errorf("%w: %s loads cniVersion 0.4.0 at most, ipledger's conflist needs 1.0.0 or later: run containerd 1.6 or later (2.0.1+ for 1.1.0)", ErrRuntimeUnsupported, rt)
		case v.less(2, 0, 1):
			return "1.0.0", fmt.Sprintf("%s loads cniVersion 1.0.0 at most (1.1.0 and STATUS from containerd 2.0.1)", rt), true, nil
		default:
			return "1.1.0", fmt.Sprintf("%s loads cniVersion 1.1.0 and calls STATUS from its CRI Status (containerd 2.0.1 and later)", rt), true, nil
		}
	case "cri-o":
		if perr != nil {
			return "", "", false, fmt.Errorf("%w: %s: version %q: %v", ErrRuntimeUnsupported, rt.Name, rt.Version, perr)
		}
		if v.less(1, 32, 0) {
			return "1.0.0", fmt.Sprintf("%s: cniVersion 1.0.0 (1.1.0 from CRI-O 1.32)", rt), true, nil
		}
		return "1.1.0", fmt.Sprintf("%s loads cniVersion 1.1.0 (CRI-O 1.32 and later)", rt), true, nil
	}
	return "", "", false, nil
}

// ChooseCNIVersion decides the conflist's cniVersion: choice is auto, keep
// or one of Versions; inConflist is the conflist's own cniVersion; rt is the
// node's runtime, nil when it was not asked. It returns the version and why,
// for the log, or an error naming the version and the runtime when the runtime
// would refuse it.
func ChooseCNIVersion(choice, inConflist string, rt *RuntimeInfo) (version, why string, err error) {
	if choice == "" {
		choice = VersionAuto
	}
	switch {
	case choice == VersionKeep:
		version, why = inConflist, "the conflist's own (--cni-version keep)"
	case choice == VersionAuto:
	case slices.Contains(Versions, choice):
		version, why = choice, "the operator's choice (--cni-version "+choice+")"
	default:
		return "", "", fmt.Errorf("%w: %q: give auto, keep or one of %s", ErrBadVersion, choice, strings.Join(Versions, ", "))
	}
	if rt == nil {
		if version == "" {
			return inConflist, "the conflist's own: the runtime was not asked (no --cri-endpoint)", nil
		}
		return version, why, nil
	}
	max, maxWhy, known, err := maxCNIVersion(*rt)
	if err != nil {
		return "", "", err
	}
	if !known {
		if version == "" {
			return "1.0.0", fmt.Sprintf("runtime %s is not one ipledger knows (containerd, cri-o): 1.0.0, which every supported runtime loads", rt), nil
		}
		return version, why + fmt.Sprintf(", unchecked: runtime %s is not one ipledger knows", rt), nil
	}
	if version == "" {
		return max, maxWhy, nil
	}
	if newer(version, max) {
		return "", "", fmt.Errorf("%w: cniVersion %s (%s) is newer than %s loads: %s; give --cni-version %s or upgrade the runtime", ErrVersionRefused, version, why, rt, maxWhy, max)
	}
	return version, why, nil
}

// WithCNIVersion returns conf with its top-level cniVersion set to version
// (the rest of the conflist as it was, re-encoded).
func WithCNIVersion(conf []byte, version string) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(conf, &m); err != nil {
		return nil, fmt.Errorf("%w: not a JSON object: %v", ErrBadConflist, err)
	}
	v, _ := json.Marshal(version)
	m["cniVersion"] = v
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadConflist, err)
	}
	return append(out, '\n'), nil
}

// conflistVersion is the conflist's top-level cniVersion ("" when absent).
func conflistVersion(conf []byte) string {
	var c struct {
		CNIVersion string `json:"cniVersion"`
	}
	_ = json.Unmarshal(conf, &c)
	return c.CNIVersion
}

type semver [3]int

func (v semver) less(major, minor, patch int) bool {
	o := semver{major, minor, patch}
	for i := range v {
		if v[i] != o[i] {
			return v[i] < o[i]
		}
	}
	return false
}

// parseVersion reads MAJOR.MINOR[.PATCH] at the start of a runtime's version
// string: "v2.3.7", "1.6.20~ds1", "2.0.1+unknown", "1.32.0-rc.1".
func parseVersion(s string) (semver, error) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "v")
	if i := strings.IndexAny(s, "~+- "); i >= 0 {
		s = s[:i]
	}
	parts := strings.Split(s, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return semver{}, errors.New("not MAJOR.MINOR.PATCH")
	}
	var v semver
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return semver{}, errors.New("not MAJOR.MINOR.PATCH")
		}
		v[i] = n
	}
	return v, nil
}

// newer reports whether CNI version a is newer than b (both parse).
func newer(a, b string) bool {
	va, err1 := parseVersion(a)
	vb, err2 := parseVersion(b)
	if err1 != nil || err2 != nil {
		return a != b
	}
	return vb.less(va[0], va[1], va[2])
}

// chainVersion checks version (chosen by ChooseCNIVersion, for why) against
// the node's own plugins of the chain (theirs, in o.BinDir: a portmap the node
// had), asking each its supported versions (CNI VERSION). Where one does not
// speak version, or cannot be asked here (a symlink into a directory this
// container does not see), an automatic 1.1.0 becomes 1.0.0, with the reason;
// the operator's explicit choice is refused (ErrVersionRefused, naming the
// plugin) when the plugin says it does not speak it, and kept when the plugin
// cannot be asked. Otherwise the runtime would load a chain whose plugin fails
// every STATUS and ADD ("missing containerID", "incompatible CNI versions")
// and the Node would stay NotReady.
func chainVersion(o Options, version, why string, theirs []string) (string, string, error) {
	auto := o.CNIVersion == "" || o.CNIVersion == VersionAuto
	if version == "" || !newer(version, "1.0.0") {
		return version, why, nil
	}
	for _, t := range theirs {
		path := filepath.Join(o.BinDir, t)
		speaks, err := pluginVersions(path)
		switch {
		case err != nil && auto:
			return "1.0.0", fmt.Sprintf("%s, but plugin %s of the chain, the node's own, could not be asked its versions (%v): 1.0.0, which the runtime and every plugin of CNI v1.0+ load", why, path, err), nil
		case err != nil:
			why += fmt.Sprintf(", unchecked: plugin %s could not be asked its versions (%v)", path, err)
		case !slices.Contains(speaks, version) && auto:
			return "1.0.0", fmt.Sprintf("%s, but plugin %s of the chain, the node's own, speaks %s at most (install CNI plugins v1.5.0 or later for %s): 1.0.0", why, path, newest(speaks), version), nil
		case !slices.Contains(speaks, version):
			return "", "", fmt.Errorf("%w: cniVersion %s (%s): plugin %s of the chain speaks %s at most; give --cni-version 1.0.0 or install CNI plugins v1.5.0 or later", ErrVersionRefused, version, why, path, newest(speaks))
		}
	}
	return version, why, nil
}

// pluginVersions runs the CNI plugin at path with CNI_COMMAND=VERSION and
// returns its supportedVersions (never empty on success).
func pluginVersions(path string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = append(os.Environ(), "CNI_COMMAND=VERSION")
	cmd.Stdin = strings.NewReader(`{"cniVersion":"1.0.0"}`)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%v %s", err, strings.TrimSpace(errOut.String()))
	}
	var v struct {
		Supported []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal(out.Bytes(), &v); err != nil || len(v.Supported) == 0 {
		return nil, fmt.Errorf("VERSION answered %q", strings.TrimSpace(out.String()))
	}
	return v.Supported, nil
}

// newest is the newest of versions.
func newest(versions []string) string {
	n := versions[0]
	for _, v := range versions[1:] {
		if newer(v, n) {
			n = v
		}
	}
	return n
}
