package reconcile

import (
	"fmt"
	"net"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// RuntimeMounts returns an Options.Mounts for the runtime serving the CRI endpoint
// (unix://PATH or PATH): the agent sees the runtime's mounts when it is in the
// mount namespace of the process listening on that socket (found by SO_PEERCRED,
// so only when the agent sees that PID: the host's PID namespace). A systemd
// unit, or a test's agent beside its runtime, is; a container is not.
func RuntimeMounts(endpoint string) func() (bool, string) {
	socket := strings.TrimPrefix(endpoint, "unix://")
	return func() (bool, string) {
		pid, err := peerPID(socket)
		if err != nil || pid == 0 {
			return false, ""
		}
		if !sameMountNS(pid) {
			return false, ""
		}
		return true, fmt.Sprintf("the agent is in the mount namespace of the runtime (PID %d serving %s): what it does not see, the runtime does not see either", pid, socket)
	}
}

// peerPID is the PID of the process listening on the unix socket, as the agent
// sees it (0 when that process is not in the agent's PID namespace).
func peerPID(socket string) (int, error) {
	c, err := net.DialTimeout("unix", socket, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	raw, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return int(cred.Pid), nil
}

// sameMountNS reports whether process pid is in the agent's mount namespace.
func sameMountNS(pid int) bool {
	var self, other unix.Stat_t
	return unix.Stat("/proc/self/ns/mnt", &self) == nil &&
		unix.Stat(fmt.Sprintf("/proc/%d/ns/mnt", pid), &other) == nil &&
		self.Dev == other.Dev && self.Ino == other.Ino
}
