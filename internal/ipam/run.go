package ipam

import (
	"bytes"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cniplugin"
)

// Run runs one handed-over call (api.CNICall) as this plugin's process would run it:
// cniplugin.Main with the call's CNI_* values as the environment and its stdin, p's
// verbs, and the identities of CNI_NETNS and of the caller's own namespace as the
// caller read them (c.NetNSID, c.SelfNetNS) instead of reading them again: the caller
// may be in another mount or network namespace than the one running Run. It returns
// what the process would have printed and its exit status; p's Stdout, Stderr and
// NetNS are set for the call. The agent runs the calls handed to it this way, and
// Forward the calls whose agent gave no answer in time.
func Run(p Plugin, c *api.CNICall) *api.CNIAnswer {
	var stdout, stderr bytes.Buffer
	p.Stdout, p.Stderr = &stdout, &stderr
	p.NetNS = func(path string) api.NetNS {
		switch path {
		case c.NetNS:
			return c.NetNSID
		case SelfNetNS:
			return c.SelfNetNS
		}
		return api.NetNS{Path: path}
	}
	env := cniplugin.Env{Stdin: bytes.NewReader(c.Stdin), Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string {
		switch k {
		case "CNI_COMMAND":
			return c.Command
		case "CNI_CONTAINERID":
			return c.ContainerID
		case "CNI_NETNS":
			return c.NetNS
		case "CNI_IFNAME":
			return c.IfName
		case "CNI_ARGS":
			return c.Args
		case "CNI_PATH":
			return c.Path
		case "CNI_NETNS_OVERRIDE":
			return c.NetNSOverride
		}
		return ""
	}}
	exit := cniplugin.Main(env, p.Funcs(), Versions, "")
	return &api.CNIAnswer{Exit: exit, Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}
}
