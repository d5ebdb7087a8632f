package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/ipledger/ipledger/internal/api"
)

// netnsChecks warns, when the runtime reconciles (the reconciler reads each
// lease's namespace recorded at ADD), of every directory holding recorded
// namespaces that this process cannot see: the reconciler can judge none of
// those leases (it keeps them, invariant 4), so a pod gone with a lease there
// is never released. It stats each directory once.
func (s *Server) netnsChecks() []api.Check {
	if s.cfg.Runtime == nil {
		return nil
	}
	leases := map[string]int{}
	for _, ls := range s.cfg.Ledger.Leases("") {
		if ls.NetNS.Path != "" {
			leases[filepath.Dir(ls.NetNS.Path)]++
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
			continue
		}
		out = append(out, api.Check{Level: api.CheckWarn, Text: fmt.Sprintf(
			"%d leases record their pod's network namespace in %s, which this agent cannot see: the reconciler cannot tell whether those namespaces still hold their addresses, so it keeps those leases however long their sandboxes are gone; fix: mount the runtime's netns directory into the agent's container at %s (hostPath, mountPropagation HostToContainer), as deploy/ipledger.yaml mounts /run/netns",
			leases[d], d, d)})
	}
	return out
}
