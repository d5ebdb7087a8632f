package veth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ipam"
)

// IPAMCall names one delegated IPAM invocation: the plugin type from the ipam
// section, the network config to send on stdin and the CNI environment.
type IPAMCall struct {
	Type        string
	NetConf     []byte
	ContainerID string
	NetNS       string
	IfName      string
	Args        string
	Path        string // CNI_PATH, searched for Type
}

// IPAM delegates address management to the IPAM plugin of the ipam section.
// Each method runs the plugin once with the matching CNI_COMMAND; errors returned
// by the plugin are *types.Error and are passed through to the runtime unchanged.
// GC and Status return nil without calling a plugin that does not speak CNI 1.1.0
// (those verbs do not exist before it); Unsupported tells which happened.
type IPAM interface {
	Add(ctx context.Context, c IPAMCall) (types.Result, error)
	Check(ctx context.Context, c IPAMCall) error
	Del(ctx context.Context, c IPAMCall) error
	GC(ctx context.Context, c IPAMCall) (unsupported bool, err error)
	Status(ctx context.Context, c IPAMCall) (unsupported bool, err error)
}

// ExecIPAM runs IPAM plugins as processes found in CNI_PATH. When the plugin
// rejects the config's cniVersion, the call is retried once with the highest
// version the plugin supports (prevResult converted to it), so a 1.1.0 network can
// use an IPAM plugin that stops at 1.0.0.
type ExecIPAM struct {
	// Stderr receives the IPAM plugin's stderr.
	Stderr io.Writer
}

var _ IPAM = (*ExecIPAM)(nil)

func (e *ExecIPAM) exec() invoke.Exec {
	return &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: e.Stderr}, PluginDecoder: version.PluginDecoder{}}
}

func (e *ExecIPAM) find(c IPAMCall) (string, error) {
	p, err := invoke.FindInPath(c.Type, splitPath(c.Path))
	if err != nil {
		return "", types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("IPAM plugin %q: %v", c.Type, err), "")
	}
	return p, nil
}

func args(verb string, c IPAMCall) *invoke.Args {
	return &invoke.Args{Command: verb, ContainerID: c.ContainerID, NetNS: c.NetNS, IfName: c.IfName, PluginArgsStr: c.Args, Path: c.Path}
}

// Add implements IPAM.
func (e *ExecIPAM) Add(ctx context.Context, c IPAMCall) (types.Result, error) {
	path, err := e.find(c)
	if err != nil {
		return nil, err
	}
	var res types.Result
	err = e.withVersion(ctx, path, c, "", func(conf []byte) error {
		var err error
		res, err = invoke.ExecPluginWithResult(ctx, path, conf, args("ADD", c), e.exec())
		return err
	})
	return res, err
}

// Check implements IPAM.
func (e *ExecIPAM) Check(ctx context.Context, c IPAMCall) error {
	return e.noResult(ctx, "CHECK", c, "")
}

// Del implements IPAM.
func (e *ExecIPAM) Del(ctx context.Context, c IPAMCall) error { return e.noResult(ctx, "DEL", c, "") }

// GC implements IPAM.
func (e *ExecIPAM) GC(ctx context.Context, c IPAMCall) (bool, error) {
	return e.needs110(ctx, "GC", c)
}

// Status implements IPAM.
func (e *ExecIPAM) Status(ctx context.Context, c IPAMCall) (bool, error) {
	return e.needs110(ctx, "STATUS", c)
}

func (e *ExecIPAM) needs110(ctx context.Context, verb string, c IPAMCall) (bool, error) {
	path, err := e.find(c)
	if err != nil {
		return false, err
	}
	info, err := invoke.GetVersionInfo(ctx, path, e.exec())
	if err != nil {
		return false, err
	}
	for _, v := range info.SupportedVersions() {
		if v == "1.1.0" {
			return false, e.noResult(ctx, verb, c, "1.1.0")
		}
	}
	return true, nil
}

func (e *ExecIPAM) noResult(ctx context.Context, verb string, c IPAMCall, minVersion string) error {
	path, err := e.find(c)
	if err != nil {
		return err
	}
	return e.withVersion(ctx, path, c, minVersion, func(conf []byte) error {
		return invoke.ExecPluginWithoutResult(ctx, path, conf, args(verb, c), e.exec())
	})
}

// withVersion runs call with the config as given and, if the plugin answers
// ErrIncompatibleCNIVersion, once more with the config rewritten to the highest
// version the plugin supports that is below the config's (and not below minVersion).
func (e *ExecIPAM) withVersion(ctx context.Context, path string, c IPAMCall, minVersion string, call func([]byte) error) error {
	err := call(c.NetConf)
	var terr *types.Error
	if err == nil || !errors.As(err, &terr) || terr.Code != types.ErrIncompatibleCNIVersion {
		return err
	}
	confVersion, verr := (&version.ConfigDecoder{}).Decode(c.NetConf)
	if verr != nil {
		return err
	}
	info, verr := invoke.GetVersionInfo(ctx, path, e.exec())
	if verr != nil {
		return err
	}
	best := ""
	for _, v := range info.SupportedVersions() {
		if ok, _ := version.GreaterThan(v, confVersion); ok {
			continue
		}
		if minVersion != "" {
			if ok, _ := version.GreaterThanOrEqualTo(v, minVersion); !ok {
				continue
			}
		}
		if ok, _ := version.GreaterThan(v, best); best == "" || ok {
			best = v
		}
	}
	if best == "" || best == confVersion {
		return err
	}
	conf, cerr := downgradeConf(c.NetConf, confVersion, best)
	if cerr != nil {
		return err
	}
	return call(conf)
}

// downgradeConf rewrites cniVersion (and prevResult, if any) of a network config.
func downgradeConf(conf []byte, from, to string) ([]byte, error) {
	m := map[string]json.RawMessage{}
	if err := json.Unmarshal(conf, &m); err != nil {
		return nil, err
	}
	v, _ := json.Marshal(to)
	m["cniVersion"] = v
	if raw, ok := m["prevResult"]; ok {
		res, err := version.NewResult(from, raw)
		if err != nil {
			return nil, err
		}
		conv, err := res.GetAsVersion(to)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(conv)
		if err != nil {
			return nil, err
		}
		m["prevResult"] = b
	}
	return json.Marshal(m)
}

func splitPath(p string) []string { return filepath.SplitList(p) }

// AgentIPAM delegates an ipam section of type "ipledger" to ipledger's agent directly:
// an ADD or DEL is handed to the agent whole (ipam.Forward: the environment and stdin
// the ipledger plugin would have been exec'd with), the agent runs that plugin's code
// on it and answers what the plugin would have printed. This spares each pod's ADD and
// DEL the exec of a second process, whose start alone (a no-op Go binary, `make
// bench`'s floor) costs about 1.5 ms on the bench machine; docs/call-breakdown.md
// compares the calls with and without it. Every other type and verb, and every call
// the agent does not run (unreachable, draining, an older agent), goes to Exec, the
// plugin found in CNI_PATH; the plugin must be there either way.
type AgentIPAM struct {
	Exec *ExecIPAM
	// Call sends a request to the agent (api.Call); NetNS reads a network
	// namespace's identity (ipam.NetNSID).
	Call  api.CallFunc
	NetNS api.NetNSFunc
}

var _ IPAM = (*AgentIPAM)(nil)

// ipledgerType is the ipam type AgentIPAM hands to the agent.
const ipledgerType = "ipledger"

// forward hands c to the agent. handled says whether the call was settled here: when
// false (not an ipledger ipam, an agent that did not run it, a plugin that wants
// another CNI version) err is nil and the caller must exec the plugin; when true, out
// is the plugin's result, or err the failure its exec would have reported (the plugin
// missing from CNI_PATH included).
func (a *AgentIPAM) forward(ctx context.Context, verb string, c IPAMCall) (out []byte, handled bool, err error) {
	if c.Type != ipledgerType {
		return nil, false, nil
	}
	if _, err := a.Exec.find(c); err != nil {
		return nil, true, err
	}
	ans, handled := ipam.Forward(ctx, a.Call, a.NetNS, api.CNICall{Command: verb, ContainerID: c.ContainerID, NetNS: c.NetNS,
		IfName: c.IfName, Args: c.Args, Path: c.Path, Stdin: c.NetConf})
	if !handled {
		return nil, false, nil
	}
	if len(ans.Stderr) > 0 && a.Exec.Stderr != nil {
		a.Exec.Stderr.Write(ans.Stderr)
	}
	if ans.Exit == 0 {
		return ans.Stdout, true, nil
	}
	// what invoke makes of a plugin's failure: its error JSON from stdout
	e := &types.Error{}
	switch {
	case len(ans.Stdout) == 0:
		e.Msg = fmt.Sprintf("netplugin failed with no error message: exit status %d", ans.Exit)
	default:
		if perr := json.Unmarshal(ans.Stdout, e); perr != nil {
			e.Msg = fmt.Sprintf("netplugin failed but error parsing its diagnostic message %q: %v", ans.Stdout, perr)
		}
	}
	if e.Code == types.ErrIncompatibleCNIVersion {
		return nil, false, nil // Exec retries with a version the plugin speaks
	}
	return nil, true, e
}

// Add implements IPAM.
func (a *AgentIPAM) Add(ctx context.Context, c IPAMCall) (types.Result, error) {
	out, handled, err := a.forward(ctx, "ADD", c)
	if !handled {
		return a.Exec.Add(ctx, c)
	}
	if err != nil {
		return nil, err
	}
	// as invoke reads a result: in the version of the configuration
	v, err := (&version.ConfigDecoder{}).Decode(c.NetConf)
	if err != nil {
		return nil, err
	}
	return version.NewResult(v, out)
}

// Del implements IPAM.
func (a *AgentIPAM) Del(ctx context.Context, c IPAMCall) error {
	_, handled, err := a.forward(ctx, "DEL", c)
	if !handled {
		return a.Exec.Del(ctx, c)
	}
	return err
}

// Check implements IPAM.
func (a *AgentIPAM) Check(ctx context.Context, c IPAMCall) error { return a.Exec.Check(ctx, c) }

// GC implements IPAM.
func (a *AgentIPAM) GC(ctx context.Context, c IPAMCall) (bool, error) { return a.Exec.GC(ctx, c) }

// Status implements IPAM.
func (a *AgentIPAM) Status(ctx context.Context, c IPAMCall) (bool, error) {
	return a.Exec.Status(ctx, c)
}
