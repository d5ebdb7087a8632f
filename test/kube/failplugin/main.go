// Command failplugin is a chained CNI plugin for the tests of test/kube only
// (never installed by deploy/). For pods whose name starts with one of
// failPods: ADD fails for the pod's first failAdd attempts (counted per pod
// name: each attempt is a new sandbox), otherwise it passes the previous
// result through; DEL fails for the first failDel attempts of each container
// ID, then succeeds (while it fails, the plugins before it in the chain are
// not called: their DEL never runs). With failDelWhile set, DEL fails only
// while that file exists.
//
// For pods whose name starts with one of blockAddPods, the first ADD (per pod
// name) writes stateDir/blocked-CONTAINERID and then blocks until the runtime
// that called it is gone (its parent process changed: the runtime was
// killed), then fails: the plugins before it in the chain answered, the
// runtime never saw the result (containerd#10744's window, made certain).
//
// control, when set, is a network configuration whose ipam plugin (Debian's
// host-local in the tests) gets the same calls a bridge + host-local network
// would in this chain's place: ADD before this plugin fails or blocks, DEL
// only when this plugin's DEL succeeds. Its dataDir is the control's books:
// what host-local would have leaked under the same runtime events.
//
// Every call is appended to stateDir/attempts.log.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

type conf struct {
	types.NetConf
	FailAdd  int      `json:"failAdd"`
	FailDel  int      `json:"failDel"`
	FailPods []string `json:"failPods"`
	// FailDelWhile, when set, is a file: DEL fails only while it exists.
	FailDelWhile string `json:"failDelWhile"`
	// BlockAddPods: pods whose first ADD blocks until the runtime is killed.
	BlockAddPods []string `json:"blockAddPods"`
	// Control is a network configuration with an ipam section, delegated to.
	Control  json.RawMessage `json:"control"`
	StateDir string          `json:"stateDir"`
}

// blockLimit bounds a blocked ADD when nobody kills the runtime.
const blockLimit = 4 * time.Minute

func parse(stdin []byte) (*conf, error) {
	var c conf
	if err := json.Unmarshal(stdin, &c); err != nil {
		return nil, err
	}
	if c.StateDir == "" {
		return nil, fmt.Errorf("failplugin: stateDir is required")
	}
	if err := version.ParsePrevResult(&c.NetConf); err != nil {
		return nil, err
	}
	return &c, nil
}

func podName(args string) string {
	for _, kv := range strings.Split(args, ";") {
		if v, ok := strings.CutPrefix(kv, "K8S_POD_NAME="); ok {
			return v
		}
	}
	return ""
}

// count increments and returns the counter stateDir/kind-key.
func count(c *conf, kind, key string) (int, error) {
	n := 0
	p := filepath.Join(c.StateDir, kind+"-"+key)
	if b, err := os.ReadFile(p); err == nil {
		n, _ = strconv.Atoi(string(b))
	}
	n++
	return n, os.WriteFile(p, []byte(strconv.Itoa(n)), 0o644)
}

func (c *conf) targets(pod string) bool { return hasPrefix(pod, c.FailPods) }

func hasPrefix(pod string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(pod, p) {
			return true
		}
	}
	return false
}

// control calls the control network's ipam plugin (ADD or DEL).
func control(c *conf, verb string) error {
	if len(c.Control) == 0 {
		return nil
	}
	var n struct {
		IPAM struct {
			Type string `json:"type"`
		} `json:"ipam"`
	}
	if err := json.Unmarshal(c.Control, &n); err != nil || n.IPAM.Type == "" {
		return fmt.Errorf("failplugin: control needs an ipam section with a type (%v)", err)
	}
	ctx := context.Background()
	if verb == "ADD" {
		_, err := invoke.DelegateAdd(ctx, n.IPAM.Type, c.Control, nil)
		return err
	}
	return invoke.DelegateDel(ctx, n.IPAM.Type, c.Control, nil)
}

// block writes stateDir/blocked-ID and waits until the parent process (the
// runtime) is gone, at most blockLimit.
func block(c *conf, id string) error {
	parent := os.Getppid()
	if err := os.WriteFile(filepath.Join(c.StateDir, "blocked-"+id), []byte(strconv.Itoa(parent)), 0o644); err != nil {
		return err
	}
	for deadline := time.Now().Add(blockLimit); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if os.Getppid() != parent {
			return types.NewError(types.ErrTryAgainLater, "failplugin: the runtime is gone", fmt.Sprintf("parent %d exited while ADD was blocked", parent))
		}
	}
	return types.NewError(types.ErrTryAgainLater, "failplugin: nobody killed the runtime", fmt.Sprintf("blocked for %v", blockLimit))
}

func record(c *conf, verb, pod, id string, n int, failing bool, netns string) {
	if f, err := os.OpenFile(filepath.Join(c.StateDir, "attempts.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
		fmt.Fprintf(f, "%s %s %s %s attempt=%d failed=%v netns=%q\n", time.Now().UTC().Format(time.RFC3339Nano), verb, pod, id, n, failing, netns)
		f.Close()
	}
}

func add(a *skel.CmdArgs) error {
	c, err := parse(a.StdinData)
	if err != nil {
		return err
	}
	pod := podName(a.Args)
	if err := control(c, "ADD"); err != nil {
		return err
	}
	switch {
	case hasPrefix(pod, c.BlockAddPods):
		n, err := count(c, "block", pod)
		if err != nil {
			return err
		}
		record(c, "ADD", pod, a.ContainerID, n, n == 1, a.Netns)
		if n == 1 {
			return block(c, a.ContainerID)
		}
	case c.targets(pod) && c.FailAdd > 0:
		n, err := count(c, "add", pod)
		if err != nil {
			return err
		}
		record(c, "ADD", pod, a.ContainerID, n, n <= c.FailAdd, a.Netns)
		if n <= c.FailAdd {
			return types.NewError(types.ErrTryAgainLater, "failplugin: setup failing on purpose", fmt.Sprintf("attempt %d of %d failing", n, c.FailAdd))
		}
	default:
		record(c, "ADD", pod, a.ContainerID, 1, false, a.Netns)
	}
	if c.PrevResult == nil {
		return fmt.Errorf("failplugin: must be chained after a plugin that returns a result")
	}
	r, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return err
	}
	return types.PrintResult(r, c.CNIVersion)
}

func del(a *skel.CmdArgs) error {
	c, err := parse(a.StdinData)
	if err != nil {
		return err
	}
	pod := podName(a.Args)
	n, err := count(c, "del", a.ContainerID)
	if err != nil {
		return err
	}
	failing := c.targets(pod) && n <= c.FailDel
	if c.FailDelWhile != "" {
		if _, err := os.Stat(c.FailDelWhile); err != nil {
			failing = false
		}
	}
	record(c, "DEL", pod, a.ContainerID, n, failing, a.Netns)
	if failing {
		return types.NewError(types.ErrTryAgainLater, "failplugin: teardown failing on purpose", fmt.Sprintf("attempt %d of %d failing", n, c.FailDel))
	}
	return control(c, "DEL")
}

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: add, Del: del, Check: func(*skel.CmdArgs) error { return nil }},
		version.PluginSupports("0.4.0", "1.0.0"), "failplugin: test-only chained plugin")
}
