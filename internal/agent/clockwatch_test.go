package agent

import (
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/clock/clocktest"
)

// TestClockWatch: a wall-clock step of more than a second between two checks is
// counted, with its size; time passing, or a small adjustment, is not.
func TestClockWatch(t *testing.T) {
	clk := clocktest.New()
	var w clockWatch
	steps := []struct {
		name  string
		move  func()
		want  time.Duration
		count int
	}{
		{"first check", func() {}, 0, 0},
		{"time passes", func() { clk.Advance(time.Minute) }, 0, 0},
		{"small adjustment", func() { clk.Advance(time.Second); clk.Step(800 * time.Millisecond) }, 0, 0},
		{"step back an hour", func() { clk.Advance(time.Second); clk.Step(-time.Hour) }, -time.Hour, 1},
		{"step forward", func() { clk.Step(90 * time.Second) }, 90 * time.Second, 2},
		{"time passes again", func() { clk.Advance(time.Hour) }, 0, 2},
	}
	for _, st := range steps {
		st.move()
		if got := w.check(clk); got != st.want {
			t.Fatalf("%s: step %v, want %v", st.name, got, st.want)
		}
		if n, last := w.seen(); n != st.count || (n > 0 && last == "") {
			t.Fatalf("%s: %d steps seen (%q), want %d", st.name, n, last, st.count)
		}
	}
}
