// Package sim is the incident simulator behind `ipledgerctl sim`: a deterministic,
// simulated-clock model of kubelet, a container runtime and a CNI chain that drives
// ipledger's real code in process (the ledger on a real bbolt file, the agent's
// request handling, the IPAM plugin's verbs, the DEL spool, the reconciler and
// supersession) and, as a baseline, the real host-local binary exec'd with the CNI
// protocol. Only the clock, the runtime and the network namespaces are modelled.
//
// Each fault knob replays one incident of ../shared/seeds at scale:
//
//   - second-sandbox (000): kubelet starts a second sandbox for a Completed pod and
//     tears it down with a DEL whose CNI_NETNS is empty;
//   - chain-teardown (001): a chained plugin fails ADD and DEL for a pod's first
//     attempts; the runtime swallows the teardown error, so the DEL never reaches IPAM;
//   - crashloop-recreate (002): crash-looping pods whose sandboxes are re-created
//     under new IDs with the old DEL skipped, on a 32-address pool for 12 hours;
//   - reboot-stale-netns (003): node reboots; the DEL of each old sandbox carries a
//     stale /proc/PID/ns/net path;
//   - runtime-restarts (004): the runtime restarts; while it is down listings fail,
//     while it reloads it lists part of its sandboxes and answers NotFound for the
//     rest, and a sandbox stopped during the restart stays NOTREADY with no DEL,
//     collected by nobody;
//   - agent-crash: ipledgerd dies at a random point (sometimes after committing an
//     ADD whose answer is lost) and restarts from its store;
//   - mix: all of the above at once, plus wall-clock steps.
//
// The chain in front of IPAM is modelled: for ipledger it behaves as ipledger-veth
// (DEL always reaches IPAM and never needs the namespace); for the baseline it behaves
// as the incidents' main plugins did (DEL finds the address through CNI_NETNS: an
// empty one finds nothing and answers success, a stale one fails).
package sim

import (
	"fmt"
	"strings"
	"time"
)

// Scenario names, in the order `--scenario all` runs them.
var Scenarios = []string{"second-sandbox", "chain-teardown", "crashloop-recreate", "reboot-stale-netns", "runtime-restarts", "agent-crash", "mix"}

// knobs are the fault knobs of one scenario; zero values disable a fault.
type knobs struct {
	secondSandbox  float64       // 000: share of completed pods that get a second sandbox torn down with an empty CNI_NETNS
	chainFail      float64       // 001: share of pods whose chained plugin fails ADD and DEL for their first 1..3 attempts
	crashloopers   int           // 002: crash-looping pods, old DEL skipped at each re-creation
	reboot         time.Duration // 003: mean time between node reboots
	runtimeRestart time.Duration // 004: mean time between runtime restarts
	agentCrash     time.Duration // mean time between agent crashes
	clockStep      time.Duration // mean time between wall-clock steps
	// duration, when set, is the scenario's fixed simulated length; pods then arrive
	// evenly over it (the crash-loop incident's 12 hours).
	duration time.Duration
	// pool, when set, is the scenario's own pool (the crash-loop incident's 32
	// addresses): subnet, first and last address.
	pool [3]string
	// fixedPods, when set, is the scenario's own pod count (overrides --pods).
	fixedPods int
}

func scenarioKnobs(name string) (knobs, error) {
	switch name {
	case "second-sandbox":
		return knobs{secondSandbox: 0.2}, nil
	case "chain-teardown":
		return knobs{chainFail: 0.05}, nil
	case "crashloop-recreate":
		// one ordinary pod every 30 s (the incident's CronJob cadence) next to the
		// four crash-looping ones, 12 simulated hours, 32 addresses
		return knobs{crashloopers: 4, duration: 12 * time.Hour, fixedPods: 1440,
			pool: [3]string{"10.32.0.0/24", "10.32.0.10", "10.32.0.41"}}, nil
	case "reboot-stale-netns":
		return knobs{reboot: 6 * time.Hour}, nil
	case "runtime-restarts":
		return knobs{runtimeRestart: 30 * time.Minute}, nil
	case "agent-crash":
		return knobs{agentCrash: 20 * time.Minute}, nil
	case "mix":
		return knobs{secondSandbox: 0.05, chainFail: 0.02, crashloopers: 4, reboot: 12 * time.Hour,
			runtimeRestart: time.Hour, agentCrash: 30 * time.Minute, clockStep: 2 * time.Hour}, nil
	}
	return knobs{}, fmt.Errorf("--scenario: %q is not one of %s, all", name, strings.Join(Scenarios, ", "))
}
