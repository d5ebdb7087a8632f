// Package clocktest is a clock that tests drive: Advance moves both readings, as time
// passing does; Step moves only the wall clock, as NTP or an operator's date command does.
package clocktest

import (
	"sync"
	"time"

	"github.com/ipledger/ipledger/internal/clock"
)

// Clock is a settable clock.Clock, safe for concurrent use.
type Clock struct {
	mu   sync.Mutex
	wall time.Time
	mono time.Duration
}

var _ clock.Clock = (*Clock)(nil)

// New starts at a fixed wall instant with a monotonic reading of zero.
func New() *Clock { return &Clock{wall: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

// Now returns the wall time.
func (c *Clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.wall }

// Mono returns the monotonic reading.
func (c *Clock) Mono() time.Duration { c.mu.Lock(); defer c.mu.Unlock(); return c.mono }

// Advance lets d pass: both readings move forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.wall = c.wall.Add(d)
	c.mono += d
	c.mu.Unlock()
}

// Step moves the wall clock by d (either sign) without any time passing.
func (c *Clock) Step(d time.Duration) { c.mu.Lock(); c.wall = c.wall.Add(d); c.mu.Unlock() }
