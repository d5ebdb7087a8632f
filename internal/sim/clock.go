package sim

import (
	"fmt"
	"time"

	"github.com/ipledger/ipledger/internal/clock"
)

// simClock is the simulated clock: wall time for records, a monotonic reading for
// durations; Step moves the wall clock only, as NTP or an operator does. It is also
// the node's boot clock: reboot starts a new boot, an agent restart does not.
type simClock struct {
	wall   time.Time
	mono   time.Duration
	boots  int           // boots since the first one
	bootAt time.Duration // mono at the current boot's start
}

var (
	_ clock.Clock = (*simClock)(nil)
	_ clock.Boot  = (*simClock)(nil)
)

func (c *simClock) Now() time.Time { return c.wall }

func (c *simClock) Mono() time.Duration { return c.mono }

// Boot names the current boot and the time since it started.
func (c *simClock) Boot() (string, time.Duration, bool) {
	return fmt.Sprintf("sim-boot-%d", c.boots), c.mono - c.bootAt, true
}

// reboot starts a new boot now.
func (c *simClock) reboot() { c.boots++; c.bootAt = c.mono }

func (c *simClock) advanceTo(m time.Duration) {
	if m > c.mono {
		c.wall = c.wall.Add(m - c.mono)
		c.mono = m
	}
}
