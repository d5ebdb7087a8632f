package bench

import (
	"math"
	"slices"
	"time"
)

// dist is a set of latency samples.
type dist []time.Duration

// pct returns the p-th percentile (nearest rank), in milliseconds; NaN when empty.
func (d dist) pct(p float64) float64 {
	if len(d) == 0 {
		return math.NaN()
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	i = max(0, min(i, len(s)-1))
	return ms(s[i])
}

func (d dist) p50() float64 { return d.pct(50) }
func (d dist) p99() float64 { return d.pct(99) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
