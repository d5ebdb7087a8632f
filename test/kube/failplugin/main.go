// Command failplugin is a chained CNI plugin for the tests of test/kube only
// (never installed by deploy/). For pods whose name starts with one of
// failPods: ADD fails for the pod's first failAdd attempts (counted per pod
// name: each attempt is a new sandbox), otherwise it passes the previous
// result through; DEL fails for the first failDel attempts of each container
// ID, then succeeds (while it fails, the plugins before it in the chain are
// not called: their DEL never runs). With failDelWhile set, DEL fails only
// while that file exists. Every call is appended to stateDir/attempts.log.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

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
	StateDir     string `json:"stateDir"`
}

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

func (c *conf) targets(pod string) bool {
	for _, p := range c.FailPods {
		if strings.HasPrefix(pod, p) {
			return true
		}
	}
	return false
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
	if pod := podName(a.Args); c.targets(pod) && c.FailAdd > 0 {
		n, err := count(c, "add", pod)
		if err != nil {
			return err
		}
		record(c, "ADD", pod, a.ContainerID, n, n <= c.FailAdd, a.Netns)
		if n <= c.FailAdd {
			return types.NewError(types.ErrTryAgainLater, "failplugin: setup failing on purpose", fmt.Sprintf("attempt %d of %d failing", n, c.FailAdd))
		}
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
	return nil
}

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: add, Del: del, Check: func(*skel.CmdArgs) error { return nil }},
		version.PluginSupports("0.4.0", "1.0.0"), "failplugin: test-only chained plugin")
}
