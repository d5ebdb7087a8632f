package clock_test

import (
	"os"
	"strings"
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

// TestSystemBoot: the machine's boot clock names this boot (as the kernel does) and
// its reading grows with time.
func TestSystemBoot(t *testing.T) {
	want, err := os.ReadFile(clock.BootIDFile)
	if err != nil {
		t.Fatal(err)
	}
	b := clock.NewSystemBoot()
	id, s1, ok := b.Boot()
	if !ok || id != strings.TrimSpace(string(want)) || s1 <= 0 {
		t.Fatalf("Boot() = %q %v %v, want %q and a positive reading", id, s1, ok, strings.TrimSpace(string(want)))
	}
	time.Sleep(10 * time.Millisecond)
	if _, s2, _ := b.Boot(); s2-s1 < 10*time.Millisecond {
		t.Fatalf("readings %v then %v, 10ms apart", s1, s2)
	}
}
