package ipam_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
)

// env is one real ipledgerd plus a libcni runtime that finds the plugins where a
// runtime would: the built binaries and Debian's /usr/lib/cni.
type env struct {
	t   *testing.T
	a   *agentenv.Agent
	cni *libcni.CNIConfig
}

func newEnv(t *testing.T, opts agentenv.Options) *env {
	t.Helper()
	a := agentenv.Start(t, opts)
	return &env{t: t, a: a, cni: newRuntime(t)}
}

// newRuntime is a libcni runtime with its own result cache.
func newRuntime(t *testing.T) *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir([]string{agentenv.Bin(t), "/usr/lib/cni"}, t.TempDir(), nil)
}

// list is a conflist whose one plugin is ipledger, called directly as runtimes call an
// IPAM plugin in libcni's own tests.
func (e *env) list(version, name, ranges string) *libcni.NetworkConfigList {
	e.t.Helper()
	return confList(e.t, fmt.Sprintf(`{"cniVersion":%q,"name":%q,"plugins":[{"type":"ipledger","ipam":%s}]}`, version, name, e.a.IPAM(ranges)))
}

func confList(t *testing.T, s string) *libcni.NetworkConfigList {
	t.Helper()
	l, err := libcni.ConfListFromBytes([]byte(s))
	if err != nil {
		t.Fatalf("conflist %s: %v", s, err)
	}
	return l
}

// pluginConf is the stdin of one direct ipledger call.
func (e *env) pluginConf(version, name, ranges string) string {
	return fmt.Sprintf(`{"cniVersion":%q,"name":%q,"type":"ipledger","ipam":%s}`, version, name, e.a.IPAM(ranges))
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

var nsCounter atomic.Int64

// uniq is a short name unique to this test process.
func uniq(prefix string) string {
	return fmt.Sprintf("%s%d%d", prefix, os.Getpid()%100000, nsCounter.Add(1))
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func rt(id, netnsPath string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: id, NetNS: netnsPath, IfName: "eth0"}
}

// cniError returns the CNI error in err, failing the test when there is none.
func cniError(t *testing.T, err error) *types.Error {
	t.Helper()
	var ce *types.Error
	if !errors.As(err, &ce) {
		t.Fatalf("want a CNI error, got %T %v", err, err)
	}
	return ce
}

func wantCode(t *testing.T, err error, code uint, words ...string) *types.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("want CNI error %d, got success", code)
	}
	ce := cniError(t, err)
	if ce.Code != code {
		t.Fatalf("want CNI error code %d, got %d: %s (%s)", code, ce.Code, ce.Msg, ce.Details)
	}
	for _, w := range words {
		if !strings.Contains(ce.Msg+" "+ce.Details, w) {
			t.Fatalf("CNI error %q (details %q) does not name %q", ce.Msg, ce.Details, w)
		}
	}
	return ce
}

// call is one direct exec of the ipledger binary, as a runtime does it.
type call struct {
	Cmd, ContainerID, Netns, IfName, Args string
	Stdin                                 string
	// Unset lists CNI_* variables to leave out of the environment.
	Unset []string
}

// execPlugin runs bin/ipledger with c's environment and stdin. It returns stdout and,
// when the plugin failed, its CNI error (checked to be the spec's JSON on stdout with a
// non-zero exit).
func execPlugin(t *testing.T, c call) ([]byte, *types.Error) {
	t.Helper()
	o := execRaw(t, c)
	if o.exit == 0 {
		return o.stdout, nil
	}
	var ce types.Error
	if jerr := json.Unmarshal(o.stdout, &ce); jerr != nil || ce.Code == 0 {
		t.Fatalf("ipledger exited %d without a CNI error on stdout: %q (stderr %q)", o.exit, o.stdout, o.stderr)
	}
	return o.stdout, &ce
}

// outcome is what one exec of the plugin wrote and its exit status.
type outcome struct {
	stdout, stderr []byte
	exit           int
}

// execRaw runs bin/ipledger with c's environment and stdin.
func execRaw(t *testing.T, c call) outcome {
	t.Helper()
	if c.IfName == "" {
		c.IfName = "eth0"
	}
	vars := map[string]string{"CNI_COMMAND": c.Cmd, "CNI_CONTAINERID": c.ContainerID, "CNI_NETNS": c.Netns,
		"CNI_IFNAME": c.IfName, "CNI_ARGS": c.Args, "CNI_PATH": agentenv.Bin(t)}
	for _, u := range c.Unset {
		delete(vars, u)
	}
	cmd := exec.Command(filepath.Join(agentenv.Bin(t), "ipledger"))
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = strings.NewReader(c.Stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("exec ipledger: %v", err)
	}
	return outcome{stdout: stdout.Bytes(), stderr: stderr.Bytes(), exit: cmd.ProcessState.ExitCode()}
}

// books is what the ledger shows through the CLI: the live leases and the audit's
// pool counters. Two equal books mean nothing changed.
type books struct {
	Leases []api.LeaseView
	Pools  any
}

func (e *env) books() books {
	e.t.Helper()
	// straight through the API: cheaper than two ipledgerctl runs per case, and the
	// same answers (internal/ctl tests the CLI's rendering of them)
	ar, err := e.a.Call(api.Request{Op: api.OpAudit})
	if err != nil {
		e.t.Fatal(err)
	}
	if a := ar.Audit; a == nil || !a.OK || a.DoubleAssigned != 0 {
		e.t.Fatalf("audit: %+v", ar.Audit)
	}
	lr, err := e.a.Call(api.Request{Op: api.OpLeases})
	if err != nil {
		e.t.Fatal(err)
	}
	return books{Leases: lr.Leases, Pools: ar.Audit.Pools}
}

func (e *env) sameBooks(before books) {
	e.t.Helper()
	after := e.books()
	if !reflect.DeepEqual(before, after) {
		e.t.Fatalf("the ledger changed:\nbefore %+v\nafter  %+v", before, after)
	}
}

// ipsOf returns the addresses (CIDR strings) of the lease of containerID, or nil.
func ipsOf(leases []api.LeaseView, network, containerID string) []string {
	for _, l := range leases {
		if l.Network == network && l.ContainerID == containerID {
			return l.IPs
		}
	}
	return nil
}

func runQuiet(name string, args ...string) error { return exec.Command(name, args...).Run() }

func runOut(name string, args ...string) ([]byte, error) {
	return exec.Command(name, args...).CombinedOutput()
}
