package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/reconcile"
)

// netnsChecks warns, when the runtime reconciles (the reconciler reads each
// lease's namespace recorded at ADD), of every directory holding recorded
// namespaces that this process cannot see. Either the runtime removed it with its
// state (a reboot; it comes back with the next pod), or it is not mounted into the
// agent's container; either way the reconciler cannot tell those namespaces gone
// (NotReady sandboxes' leases there are kept: gone needs positive evidence). Of a
// directory it sees, it runs the reconciler's canary (reconcile.Resolves) on the
// namespaces of the sandboxes the last round found READY: one that does not stat
// to its recorded identity means the directory is mounted without propagation
// (the agent sees the mount points, not the mounts made since it started).
func (s *Server) netnsChecks() []api.Check {
	if s.cfg.Runtime == nil {
		return nil
	}
	leases := map[string]int{}
	ready, unseen := map[string]int{}, map[string]string{}
	for _, ls := range s.cfg.Ledger.Leases("") {
		if ls.NetNS.Path == "" {
			continue
		}
		d := filepath.Dir(ls.NetNS.Path)
		leases[d]++
		if ls.NetNS.Ino == 0 || s.cfg.Verdicts == nil || s.cfg.Verdicts.Verdict(ls.Key).Sandbox != reconcile.SandboxReady {
			continue
		}
		ready[d]++
		if !reconcile.Resolves(ls.NetNS) {
			if _, ok := unseen[d]; !ok {
				unseen[d] = ls.NetNS.Path
			}
		}
	}
	dirs := make([]string, 0, len(leases))
	for d := range leases {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	var out []api.Check
	for _, d := range dirs {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			if p, ok := unseen[d]; ok {
				out = append(out, api.Check{Level: api.CheckWarn, Text: fmt.Sprintf(
					"the network namespaces of READY sandboxes in %s are not all visible to this agent (%s does not resolve to the namespace recorded at ADD; %d READY there): the directory is mounted without mount propagation, so NotReady sandboxes' leases there are kept, never judged gone; fix: mount the host's %s into the agent's container with mountPropagation: HostToContainer, as deploy/ipledger.yaml mounts /run/netns",
					d, p, ready[d], d)})
			}
			continue
		}
		out = append(out, api.Check{Level: api.CheckWarn, Text: fmt.Sprintf(
			"%d leases record their pod's network namespace in %s, which this agent cannot see: unless the runtime removed it with its state (after a reboot; it comes back with the next pod), the reconciler cannot judge whether those namespaces still hold their addresses; fix: mount the runtime's netns directory into the agent's container at %s (hostPath, mountPropagation HostToContainer), as deploy/ipledger.yaml mounts /run/netns",
			leases[d], d, d)})
	}
	return out
}
