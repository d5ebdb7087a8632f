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

// Boot is a settable clock.Boot, safe for concurrent use.
type Boot struct {
	mu    sync.Mutex
	id    string
	since time.Duration
	ok    bool
}

var _ clock.Boot = (*Boot)(nil)

// NewBoot is a boot called id that started since ago.
func NewBoot(id string, since time.Duration) *Boot { return &Boot{id: id, since: since, ok: true} }

// Boot implements clock.Boot.
func (b *Boot) Boot() (string, time.Duration, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.id, b.since, b.ok
}

// Advance lets d pass.
func (b *Boot) Advance(d time.Duration) { b.mu.Lock(); b.since += d; b.mu.Unlock() }

// Reboot starts boot id, since ago.
func (b *Boot) Reboot(id string, since time.Duration) {
	b.mu.Lock()
	b.id, b.since, b.ok = id, since, true
	b.mu.Unlock()
}

// Unknown makes every reading unknown (no boot ID, or no CLOCK_BOOTTIME).
func (b *Boot) Unknown() { b.mu.Lock(); b.ok = false; b.mu.Unlock() }
