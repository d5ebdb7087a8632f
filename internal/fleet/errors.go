package fleet

import "errors"

// Why a node's agent could not be asked; each wraps the cause and the node's result
// names it.
var (
	// ErrNoAgentPod: no pod of the agents' selector runs on the node (the DaemonSet
	// is not installed, or does not tolerate the node's taints).
	ErrNoAgentPod = errors.New("no agent pod")
	// ErrAgentNotRunning: the node's agent pod is not Running (Pending, Failed).
	ErrAgentNotRunning = errors.New("agent pod not running")
	// ErrForbidden: the API server's authorization refused a request (RBAC).
	ErrForbidden = errors.New("forbidden")
	// ErrNotDaemonSetPod: pods match the agents' selector on the node, but none is
	// owned by the agents' DaemonSet (its controller owner reference names another
	// owner, or another DaemonSet of that name: a different UID); they are not asked.
	ErrNotDaemonSetPod = errors.New("no pod of the agents' DaemonSet")
	// ErrNoDaemonSet: the agents' DaemonSet does not exist in the namespace.
	ErrNoDaemonSet = errors.New("no agents' DaemonSet")
	// ErrNoAnswer: ipledgerctl in the agent pod printed no answer (it exited with an
	// error, e.g. the agent's socket did not answer).
	ErrNoAnswer = errors.New("no answer from ipledgerctl")
)
