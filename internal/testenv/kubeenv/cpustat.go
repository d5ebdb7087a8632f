package kubeenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// CPUTimes are the machine's CPU time counters (/proc/stat's cpu line, in
// ticks): every CPU's total, and the part idle or waiting for I/O.
type CPUTimes struct{ Total, Idle uint64 }

// MachineCPU reads the machine's CPU time counters.
func MachineCPU(tb testing.TB) CPUTimes {
	tb.Helper()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		tb.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	c, err := parseCPULine(line)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// parseCPULine reads /proc/stat's first line: user, nice, system, idle, iowait,
// irq, softirq and steal count; guest and guest_nice, which follow, are already
// counted in user and nice.
func parseCPULine(line string) (CPUTimes, error) {
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return CPUTimes{}, fmt.Errorf("/proc/stat begins %q", line)
	}
	var c CPUTimes
	for k, v := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return CPUTimes{}, fmt.Errorf("/proc/stat: %q: %v", line, err)
		}
		c.Total += n
		if k == 3 || k == 4 { // idle, iowait
			c.Idle += n
		}
	}
	return c, nil
}

// Since is what the counters counted between then and c.
func (c CPUTimes) Since(then CPUTimes) CPUTimes {
	return CPUTimes{Total: c.Total - then.Total, Idle: c.Idle - then.Idle}
}

// Busy is the share of the counted time not idle (0 when none was counted).
func (c CPUTimes) Busy() float64 {
	if c.Total == 0 {
		return 0
	}
	return 1 - float64(c.Idle)/float64(c.Total)
}
