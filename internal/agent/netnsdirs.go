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
// namespaces that this process cannot see. Either the runtime removed it with its
// state (a reboot; it comes back with the next pod), or it is not mounted into the
// agent's container, and then the reconciler misjudges those namespaces: gone when
// the directory's parent is visible, unknowable (NotReady sandboxes' leases kept)
// when not. It stats each directory once.
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
			"%d leases record their pod's network namespace in %s, which this agent cannot see: unless the runtime removed it with its state (after a reboot; it comes back with the next pod), the reconciler cannot judge whether those namespaces still hold their addresses; fix: mount the runtime's netns directory into the agent's container at %s (hostPath, mountPropagation HostToContainer), as deploy/ipledger.yaml mounts /run/netns",
			leases[d], d, d)})
	}
	return out
}
