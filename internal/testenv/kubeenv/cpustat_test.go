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
