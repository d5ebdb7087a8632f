package containerdenv

// For the external tests: the process probes the env's cleanup itself relies on.
var (
	Alive   = alive
	Cmdline = cmdline
)
