package cniplugin

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/ipledger/ipledger/internal/testenv"
)

// The test binary doubles as two plugins, chosen by roleEnv: "skel" runs the CNI
// library's skel, "ours" this package's Main, each with the same verbs (testVerbs).
const (
	roleEnv    = "CNIPLUGIN_TEST_ROLE"
	outcomeEnv = "CNIPLUGIN_TEST_OUTCOME" // ok, cnierr or plainerr
	about      = "test-plugin: a plugin of the cniplugin tests"
)

var testVersions = []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "skel":
		v := testVerbs("skel")
		skel.PluginMainFuncs(skel.CNIFuncs{Add: v.Add, Del: v.Del, Check: v.Check, GC: v.GC, Status: v.Status}, version.PluginSupports(testVersions...), about)
		os.Exit(0)
	case "ours":
		v := testVerbs("ours")
		wrap := func(f func(*skel.CmdArgs) error) func(*Args) error {
			return func(a *Args) error {
				return f(&skel.CmdArgs{ContainerID: a.ContainerID, Netns: a.Netns, IfName: a.IfName, Args: a.Args, Path: a.Path, NetnsOverride: a.NetnsOverride, StdinData: a.StdinData})
			}
		}
		os.Exit(Main(OS(), Funcs{Add: wrap(v.Add), Del: wrap(v.Del), Check: wrap(v.Check), GC: wrap(v.GC), Status: wrap(v.Status)}, testVersions, about))
	}
	os.Exit(m.Run())
}

// testVerbs returns verbs that write what they were called with and then succeed or
// fail as outcomeEnv says. The errors are the library's *types.Error for skel and
// *Error for ours, with the same fields.
func testVerbs(role string) skel.CNIFuncs {
	verb := func(name string) func(*skel.CmdArgs) error {
		return func(a *skel.CmdArgs) error {
			fmt.Printf("%s id=%q netns=%q if=%q args=%q path=%q override=%q stdin=%q\n", name, a.ContainerID, a.Netns, a.IfName, a.Args, a.Path, a.NetnsOverride, a.StdinData)
			switch os.Getenv(outcomeEnv) {
			case "cnierr":
				if role == "skel" {
					return types.NewError(107, name+" failed", "some details")
				}
				return NewError(107, name+" failed", "some details")
			case "plainerr":
				return errors.New(name + " broke")
			}
			return nil
		}
	}
	return skel.CNIFuncs{Add: verb("ADD"), Del: verb("DEL"), Check: verb("CHECK"), GC: verb("GC"), Status: verb("STATUS")}
}

type outcome struct {
	stdout, stderr string
	exit           int
}

// runRole runs the test binary as role on env and stdin; err is set only when the
// process could not run at all.
func runRole(role string, env map[string]string, stdin string) (outcome, error) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = []string{roleEnv + "=" + role, "PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	o := outcome{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		o.exit = ee.ExitCode()
	case err != nil:
		return o, fmt.Errorf("%s: %w", role, err)
	}
	return o, nil
}

// TestDispatchMatchesSkel runs the library's skel and Main as processes on the same
// environments and stdin, and requires the same stdout, stderr and exit status:
// which variables each verb needs and how they are checked, the configuration's
// checks, version reconciliation, the verbs' arguments, errors and the VERSION
// answer. CNI_NETNS points at a path that is no namespace: skel's check after ADD and
// DEL that the namespace is not the plugin's own is not part of Main (the IPAM plugin
// refuses the host namespace before it allocates: internal/ipam TestBadInput, "host network namespace").
func TestDispatchMatchesSkel(t *testing.T) {
	full := func() map[string]string {
		return map[string]string{"CNI_CONTAINERID": "c0ffee", "CNI_NETNS": "/nonexistent/netns", "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin"}
	}
	conf := func(v string) string { return `{"cniVersion":"` + v + `","name":"net1","type":"test"}` }
	commands := []string{"ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "", "BOGUS", "add"}
	envCases := []struct {
		name string
		edit func(map[string]string)
	}{
		{"all set", func(map[string]string) {}},
		{"no container id", func(e map[string]string) { delete(e, "CNI_CONTAINERID") }},
		{"no netns", func(e map[string]string) { delete(e, "CNI_NETNS") }},
		{"no ifname", func(e map[string]string) { delete(e, "CNI_IFNAME") }},
		{"no path", func(e map[string]string) { delete(e, "CNI_PATH") }},
		{"nothing", func(e map[string]string) { clear(e) }},
		{"container id with a space", func(e map[string]string) { e["CNI_CONTAINERID"] = "a b" }},
		{"container id starting with a dash", func(e map[string]string) { e["CNI_CONTAINERID"] = "-abc" }},
		{"container id with a dot and underscore", func(e map[string]string) { e["CNI_CONTAINERID"] = "a.b_c-D9" }},
		{"container id not ASCII", func(e map[string]string) { e["CNI_CONTAINERID"] = "café" }},
		{"ifname of 16 bytes", func(e map[string]string) { e["CNI_IFNAME"] = "abcdefghijklmnop" }},
		{"ifname of 15 bytes", func(e map[string]string) { e["CNI_IFNAME"] = "abcdefghijklmno" }},
		{"ifname with a slash", func(e map[string]string) { e["CNI_IFNAME"] = "a/b" }},
		{"ifname with a colon", func(e map[string]string) { e["CNI_IFNAME"] = "a:b" }},
		{"ifname with a tab", func(e map[string]string) { e["CNI_IFNAME"] = "a\tb" }},
		{"ifname with a no-break space", func(e map[string]string) { e["CNI_IFNAME"] = "a\u00a0b" }},
		{"ifname dot", func(e map[string]string) { e["CNI_IFNAME"] = "." }},
		{"ifname dotdot", func(e map[string]string) { e["CNI_IFNAME"] = ".." }},
		{"cni args and override", func(e map[string]string) {
			e["CNI_ARGS"] = "IgnoreUnknown=1;K8S_POD_NAME=p"
			e["CNI_NETNS_OVERRIDE"] = "true"
		}},
	}
	configs := []struct{ name, stdin string }{
		{"1.1.0", conf("1.1.0")}, {"1.0.0", conf("1.0.0")}, {"0.4.0", conf("0.4.0")}, {"0.3.1", conf("0.3.1")},
		{"0.3.0", conf("0.3.0")}, {"0.2.0", conf("0.2.0")}, {"0.1.0", conf("0.1.0")}, {"2.0.0", conf("2.0.0")},
		{"1.1", conf("1.1")}, {"1", conf("1")}, {"version not a number", conf("abc")}, {"version x", conf("1.x.0")},
		{"version of four parts", conf("1.0.0.0")}, {"version empty", conf("")},
		{"no version", `{"name":"net1","type":"test"}`},
		{"version a number", `{"cniVersion":1.0,"name":"net1"}`},
		{"not JSON", `{"cniVersion":`}, {"empty stdin", ``}, {"an array", `[]`}, {"null", `null`},
		{"no name", `{"cniVersion":"1.0.0"}`}, {"empty name", `{"cniVersion":"1.0.0","name":""}`},
		{"name a number", `{"cniVersion":"1.0.0","name":7}`}, {"name null", `{"cniVersion":"1.0.0","name":null}`},
		{"bad name", `{"cniVersion":"1.0.0","name":"my net"}`}, {"name with an escape", `{"cniVersion":"1.0.0","name":"n\u0065t"}`},
		{"Name in capitals", `{"cniVersion":"1.0.0","Name":"net1"}`}, {"two names", `{"cniVersion":"1.0.0","name":"a b","name":"net1"}`},
		{"two versions", `{"cniVersion":"0.2.0","name":"net1","cniVersion":"1.0.0"}`},
		{"CNIVERSION in capitals", `{"CNIVERSION":"0.2.0","name":"net1"}`},
		{"nested", `{"cniVersion":"1.1.0","name":"net1","ipam":{"name":"x","cniVersion":"0.1.0"},"dns":{"nameservers":["10.0.0.10"]}}`},
	}
	type tc struct {
		cmd, name string
		env       map[string]string
		stdin     string
	}
	var cases []tc
	for _, cmd := range commands {
		for _, ec := range envCases {
			e := full()
			ec.edit(e)
			if cmd != "" && ec.name != "nothing" {
				e["CNI_COMMAND"] = cmd
			}
			cases = append(cases, tc{cmd, "env " + ec.name, e, conf("1.1.0")})
		}
		for _, c := range configs {
			e := full()
			if cmd != "" {
				e["CNI_COMMAND"] = cmd
			}
			cases = append(cases, tc{cmd, "config " + c.name, e, c.stdin})
		}
		if cmd == "" || cmd == "VERSION" || cmd == "BOGUS" || cmd == "add" {
			continue
		}
		for _, o := range []string{"cnierr", "plainerr"} {
			e := full()
			e["CNI_COMMAND"] = cmd
			e[outcomeEnv] = o
			cases = append(cases, tc{cmd, "verb " + o, e, conf("1.1.0")})
		}
	}
	// Each process is milliseconds of CPU, its wall time mostly exec and
	// scheduling: a command's cases run their processes a few at a time, then
	// compare in order (-run TestDispatchMatchesSkel/ADD runs ADD's alone).
	// Under -short a command runs every stride-th of its cases, starting at its
	// own offset, so that each environment and each config still meets skel
	// under some command (over 1,000 processes are half a minute or more here).
	stride := testenv.Size(1, 3)
	for ci, cmd := range commands {
		group := cmd
		if group == "" {
			group = "no command"
		}
		t.Run(group, func(t *testing.T) {
			type pair struct {
				want, got outcome
				err       error
			}
			var mine []tc
			n := 0
			for _, c := range cases {
				if c.cmd != cmd {
					continue
				}
				if n%stride == ci%stride {
					mine = append(mine, c)
				}
				n++
			}
			pairs := make([]pair, len(mine))
			sem := make(chan struct{}, 8)
			var wg sync.WaitGroup
			for i, c := range mine {
				wg.Go(func() {
					sem <- struct{}{}
					defer func() { <-sem }()
					p := &pairs[i]
					if p.want, p.err = runRole("skel", c.env, c.stdin); p.err == nil {
						p.got, p.err = runRole("ours", c.env, c.stdin)
					}
				})
			}
			wg.Wait()
			for i, c := range mine {
				t.Run(c.name, func(t *testing.T) {
					want, got := pairs[i].want, pairs[i].got
					if err := pairs[i].err; err != nil {
						t.Fatal(err)
					}
					if got != want {
						t.Errorf("env %v stdin %q:\nskel: exit %d stdout %q stderr %q\nours: exit %d stdout %q stderr %q",
							c.env, c.stdin, want.exit, want.stdout, want.stderr, got.exit, got.stdout, got.stderr)
					}
				})
			}
		})
	}
	t.Logf("%d cases", len(cases))
}
