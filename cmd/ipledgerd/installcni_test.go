package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeRuntime answers the CRI Version call as the named runtime would.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	name, version string
}

func (f fakeRuntime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: f.name, RuntimeVersion: f.version, RuntimeApiVersion: "v1"}, nil
}

// serveFakeRuntime serves f's CRI on a unix socket until the test ends and
// returns its endpoint.
func serveFakeRuntime(t *testing.T, f fakeRuntime) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(s, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(l) }()
	t.Cleanup(func() { s.Stop(); <-done })
	return "unix://" + sock
}

// TestInstallCNIAsksTheRuntime: install-cni asks the runtime at
// --cri-endpoint for its version over CRI and writes cniVersion 1.1.0 for
// containerd 2.0.1+ and 1.0.0 for containerd 1.6, saying which and why; the
// operator's --cni-version wins; 1.1.0 on containerd 1.6, a runtime too old
// and a runtime that cannot be asked each get one line on stderr naming what
// is wrong, and exit 1 with nothing installed.
func TestInstallCNIAsksTheRuntime(t *testing.T) {
	for _, tc := range []struct {
		name, version string // the runtime's; "" for no runtime at the endpoint
		flags         []string
		code          int
		want          string   // the installed cniVersion
		says          []string // in stdout (code 0) or stderr
	}{
		{"containerd", "v2.3.7", nil, 0, "1.1.0", []string{"cniVersion 1.1.0: containerd v2.3.7 loads cniVersion 1.1.0 and calls STATUS"}},
		{"containerd", "1.6.20~ds1", nil, 0, "1.0.0", []string{"cniVersion 1.0.0: containerd 1.6.20~ds1 loads cniVersion 1.0.0 at most"}},
		{"containerd", "v2.3.7", []string{"--cni-version", "1.0.0"}, 0, "1.0.0", []string{"cniVersion 1.0.0: the operator's choice"}},
		{"containerd", "1.6.20~ds1", []string{"--cni-version", "1.1.0"}, 1, "", []string{"cniVersion 1.1.0", "containerd 1.6.20~ds1", "--cni-version 1.0.0"}},
		{"containerd", "v1.5.18", nil, 1, "", []string{"containerd v1.5.18", "1.6 or later"}},
		{"", "", nil, 1, "", []string{"--cni-version auto needs the runtime's version", "runtime socket missing", "give --cni-version"}},
		{"", "", []string{"--cni-version", "1.1.0"}, 0, "1.1.0", []string{"cniVersion 1.1.0: the operator's choice"}},
	} {
		t.Run(tc.name+tc.version+strings.Join(tc.flags, ""), func(t *testing.T) {
			d := t.TempDir()
			src, bin, confd := filepath.Join(d, "src"), filepath.Join(d, "bin"), filepath.Join(d, "net.d")
			for _, dir := range []string{src, bin, confd} {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range []string{"ipledger", "ipledger-veth", "portmap"} {
				if err := os.WriteFile(filepath.Join(src, p), []byte(p), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			conf := filepath.Join(d, "conflist")
			if err := os.WriteFile(conf, []byte(`{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ipledger-veth","ipam":{"type":"ipledger"}}]}`), 0o644); err != nil {
				t.Fatal(err)
			}
			endpoint := "unix://" + filepath.Join(d, "absent.sock")
			if tc.name != "" {
				endpoint = serveFakeRuntime(t, fakeRuntime{name: tc.name, version: tc.version})
			}
			args := append([]string{"--src-dir", src, "--conflist", conf, "--cni-bin-dir", bin, "--cni-conf-dir", confd, "--cri-endpoint", endpoint}, tc.flags...)
			var out, errb strings.Builder
			code := installCNI(args, &out, &errb)
			said := out.String()
			if tc.code != 0 {
				said = errb.String()
				if n := strings.Count(strings.TrimSpace(said), "\n"); n != 0 {
					t.Errorf("stderr is %d lines, want one: %q", n+1, said)
				}
			}
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stdout %q stderr %q", code, tc.code, out.String(), errb.String())
			}
			for _, s := range tc.says {
				if !strings.Contains(said, s) {
					t.Errorf("output %q does not say %q", said, s)
				}
			}
			b, err := os.ReadFile(filepath.Join(confd, "10-ipledger.conflist"))
			if tc.want == "" {
				if err == nil {
					t.Fatalf("installed a conflist after exit %d: %s", code, b)
				}
				return
			}
			var got struct {
				CNIVersion string `json:"cniVersion"`
			}
			if err != nil || json.Unmarshal(b, &got) != nil || got.CNIVersion != tc.want {
				t.Fatalf("installed conflist %s (%v), want cniVersion %s", b, err, tc.want)
			}
		})
	}
}
