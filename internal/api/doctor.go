package api

import "time"

// Verdicts of the reconciler on a live lease, as in LeaseView.Verdict.
const (
	// VerdictSuspect: suspected but unverifiable (e.g. NOTREADY with no namespace
	// recorded); kept.
	VerdictSuspect = "suspect"
	// VerdictStranded: the sandbox is NOTREADY or gone but its namespace still holds
	// the address; kept.
	VerdictStranded = "stranded"
	// VerdictLeaked: the holder can no longer use the address; released once the
	// evidence has held for the release grace.
	VerdictLeaked = "leaked"
)

// Diagnosis is the agent's answer to OpDoctor: what it knows about its own health.
type Diagnosis struct {
	// Runtime: none (no --cri-endpoint), ok, or unreachable.
	Runtime        string `json:"runtime"`
	RuntimeVersion string `json:"runtimeVersion,omitempty"`
	RuntimeError   string `json:"runtimeError,omitempty"`
	// SpoolBacklog counts DELs waiting in the spool.
	SpoolBacklog int `json:"spoolBacklog"`
	// Pools: usage of each network's pool.
	Pools []PoolUse `json:"pools"`
	// NotReady lists the sandboxes the runtime reports NOTREADY.
	NotReady []SandboxAge `json:"notReady,omitempty"`
	// Books: the ledger's audit.
	BooksBalanced bool     `json:"booksBalanced"`
	Problems      []string `json:"problems,omitempty"`
	// ClockSteps counts wall-clock steps seen since the agent started.
	ClockSteps int       `json:"clockSteps"`
	LastStep   string    `json:"lastStep,omitempty"`
	Now        time.Time `json:"now"`
	// ClusterChecks: in cluster mode, the agent's verdicts on its datastore, its node
	// lease, each cluster network's blocks and the leases left in lost blocks (the
	// agent judges them: it holds the lease's monotonic clock). Absent in node mode.
	ClusterChecks []Check `json:"clusterChecks,omitempty"`
	// NetworkChecks: with --node-name, the node network's verdicts (the Node's
	// podCIDR, routes of other owners, next hops not on-link). Absent without.
	NetworkChecks []Check `json:"networkChecks,omitempty"`
}

// Check levels, worst last (doctor's exit status is the worst level's).
const (
	CheckOK   = "OK"
	CheckWarn = "WARN"
	CheckFail = "FAIL"
)

// Check is one doctor line: a level and a text that names what to do.
type Check struct {
	Level string `json:"level"`
	Text  string `json:"text"`
}

// PoolUse is the usage of one network's pool (addresses, all range sets summed;
// Exhausted when some range set can serve no ADD now).
type PoolUse struct {
	Network   string `json:"network"`
	Usable    uint64 `json:"usable"`
	InUse     int    `json:"inUse"`
	Cooling   int    `json:"cooling"`
	Exhausted bool   `json:"exhausted"`
	// MostUsed is the highest in-use fraction over the pool's range sets.
	MostUsed float64 `json:"mostUsed"`
}

// SandboxAge is a sandbox and when it was created.
type SandboxAge struct {
	ID        string    `json:"id"`
	Namespace string    `json:"namespace,omitempty"`
	Name      string    `json:"name,omitempty"`
	Created   time.Time `json:"created"`
}
