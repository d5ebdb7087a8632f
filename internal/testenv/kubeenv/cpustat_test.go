package kubeenv

import (
	"runtime"
	"testing"
	"time"
)

// TestMachineCPU: the counters only grow, 200 ms of one spinning goroutine
// shows as busy time, and the share stays between 0 and 1.
func TestMachineCPU(t *testing.T) {
	before := MachineCPU(t)
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
		runtime.Gosched()
	}
	d := MachineCPU(t).Since(before)
	if d.Total == 0 || d.Idle > d.Total {
		t.Fatalf("200 ms of spinning counted %+v", d)
	}
	if b := d.Busy(); b <= 0 || b > 1 {
		t.Fatalf("busy share %v over 200 ms of spinning, want in (0, 1]", b)
	}
	if (CPUTimes{}).Busy() != 0 {
		t.Fatal("no time counted: busy share not 0")
	}
}

// parseCPULine counts user to steal once each, idle and iowait as idle, and
// leaves out guest and guest_nice (already in user and nice); a line that is
// not the cpu line, or has a field that is not a number, is refused.
func TestParseCPULine(t *testing.T) {
	for _, c := range []struct {
		line string
		want CPUTimes
	}{
		{"cpu  100 1 50 800 20 3 4 2 0 0", CPUTimes{Total: 980, Idle: 820}},
		{"cpu  100 1 50 800 20 3 4 2 60 5", CPUTimes{Total: 980, Idle: 820}}, // a host running guests
		{"cpu  100 1 50 800 20 3", CPUTimes{Total: 974, Idle: 820}},          // an old kernel's five fields
	} {
		if got, err := parseCPULine(c.line); err != nil || got != c.want {
			t.Errorf("parseCPULine(%q) = %+v, %v; want %+v", c.line, got, err, c.want)
		}
	}
	for _, bad := range []string{"intr 1 2 3 4 5 6", "cpu 1 2", "cpu  100 x 50 800 20 3"} {
		if _, err := parseCPULine(bad); err == nil {
			t.Errorf("parseCPULine(%q) accepted", bad)
		}
	}
}
