package clock_test

import (
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/clock/clocktest"
)

func TestSystemMonoNeverDecreases(t *testing.T) {
	c := clock.NewSystem()
	prev := c.Mono()
	for i := 0; i < 1000; i++ {
		m := c.Mono()
		if m < prev {
			t.Fatalf("Mono went back: %v after %v", m, prev)
		}
		prev = m
	}
	if got := c.Now(); got != got.Round(0) {
		t.Fatalf("Now carries a monotonic reading: %v", got)
	}
}

func TestFakeStepMovesOnlyWall(t *testing.T) {
	c := clocktest.New()
	w0, m0 := c.Now(), c.Mono()
	c.Step(-time.Hour)
	if c.Mono() != m0 || !c.Now().Equal(w0.Add(-time.Hour)) {
		t.Fatalf("Step(-1h): wall %v mono %v", c.Now(), c.Mono())
	}
	c.Advance(time.Minute)
	if c.Mono() != m0+time.Minute || !c.Now().Equal(w0.Add(-59*time.Minute)) {
		t.Fatalf("Advance(1m): wall %v mono %v", c.Now(), c.Mono())
	}
}
