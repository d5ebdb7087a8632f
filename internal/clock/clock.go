// Package clock gives ipledger two readings of time. Wall time (Now) is what records
// show people: a lease's creation, a release's date. Elapsed time (Mono) is what every
// "how long ago" decision uses: the reuse delay, the release grace, a lease still in
// creation. A wall clock steps (NTP at boot, an operator's date command); a monotonic
// reading does not, so no decision that frees an address can be hurried or starved by a
// step.
package clock

import (
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Clock is the time source the ledger, the agent and the reconciler are given.
//
// Now returns the wall-clock time; it may step forwards or backwards.
// Mono returns the time elapsed since a fixed origin chosen when the Clock was made; it
// never decreases and wall-clock steps do not move it. Mono readings are meaningful only
// within one process (one Clock): they are never persisted.
type Clock interface {
	Now() time.Time
	Mono() time.Duration
}

// System is the machine's clock: time.Now for wall time and Go's monotonic reading for
// elapsed time.
type System struct{ origin time.Time }

var _ Clock = (*System)(nil)

// NewSystem returns the machine's clock with its monotonic origin at this call.
func NewSystem() *System { return &System{origin: time.Now()} }

// Now returns the wall-clock time without its monotonic reading, so it compares and
// serializes as the wall time it shows.
func (s *System) Now() time.Time { return time.Now().Round(0) }

// Mono returns the time elapsed since NewSystem, by the monotonic clock.
func (s *System) Mono() time.Duration { return time.Since(s.origin) }

// Boot reads the time since the machine booted (CLOCK_BOOTTIME: it counts suspend and
// never steps) and names the boot. Unlike Mono, a Boot reading persisted by one process
// means something to another on the same boot (same ID): it is how a released
// address's reuse delay survives an agent restart.
type Boot interface {
	// Boot returns the boot's ID and the time since it started; ok is false when
	// either is unknown.
	Boot() (id string, since time.Duration, ok bool)
}

// SystemBoot is the machine's boot clock: /proc/sys/kernel/random/boot_id (read once)
// and clock_gettime(CLOCK_BOOTTIME).
type SystemBoot struct{ id string }

var _ Boot = (*SystemBoot)(nil)

// BootIDFile names the current boot (Linux).
const BootIDFile = "/proc/sys/kernel/random/boot_id"

// NewSystemBoot reads the boot ID; without it every reading is unknown.
func NewSystemBoot() *SystemBoot {
	b, _ := os.ReadFile(BootIDFile)
	return &SystemBoot{id: strings.TrimSpace(string(b))}
}

// Boot implements Boot.
func (b *SystemBoot) Boot() (string, time.Duration, bool) {
	var ts unix.Timespec
	if b.id == "" || unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return "", 0, false
	}
	return b.id, time.Duration(ts.Nano()), true
}
