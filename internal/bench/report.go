package bench

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// Report is the result of one run.
type Report struct {
	Machine  Machine       `json:"machine"`
	Rows     []Row         `json:"rows"`
	Targets  []Target      `json:"targets"`
	Notes    []string      `json:"notes"`
	Duration time.Duration `json:"duration"`
}

// Machine is where the run happened.
type Machine struct {
	Host       string    `json:"host"`
	Kernel     string    `json:"kernel"`
	CPU        string    `json:"cpu"`
	Cores      int       `json:"cores"`
	MemoryMiB  int       `json:"memoryMiB"`
	Go         string    `json:"go"`
	CNIPlugins string    `json:"cniPlugins"` // Debian package version of host-local and ptp
	BinDir     string    `json:"binDir"`
	Smoke      bool      `json:"smoke"`
	Time       time.Time `json:"time"`
}

// Row is one measurement of ipledger and, when there is one, the baseline (host-local,
// or ptp with host-local) and the exec floor, all from the same run. Zero-valued
// comparisons are NaN.
type Row struct {
	Group    string  `json:"group"`
	Name     string  `json:"name"`
	Unit     string  `json:"unit"`
	IPledger float64 `json:"ipledger"`
	Baseline float64 `json:"baseline"`
	Floor    float64 `json:"floor"`
}

// VsBaseline is ipledger / baseline (NaN without a baseline).
func (r Row) VsBaseline() float64 { return ratio(r.IPledger, r.Baseline) }

// VsFloor is ipledger / floor (NaN without a floor).
func (r Row) VsFloor() float64 { return ratio(r.IPledger, r.Floor) }

func ratio(a, b float64) float64 {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return math.NaN()
	}
	return a / b
}

// Target is one of the benchmark's goals with the value this run measured.
type Target struct {
	Goal     string  `json:"goal"`
	Measured string  `json:"measured"`
	Met      bool    `json:"met"`
	Value    float64 `json:"value"`
}

var nan = math.NaN()

func (h *harness) row(group, name, unit string, ipl, base, floor float64) {
	h.rep.Rows = append(h.rep.Rows, Row{Group: group, Name: name, Unit: unit, IPledger: ipl, Baseline: base, Floor: floor})
}

func (h *harness) note(format string, args ...any) {
	h.rep.Notes = append(h.rep.Notes, fmt.Sprintf(format, args...))
}

// Find returns the row of group and name.
func (r *Report) Find(group, name string) (Row, bool) {
	for _, row := range r.Rows {
		if row.Group == group && row.Name == name {
			return row, true
		}
	}
	return Row{}, false
}

func (r *Report) findPrefix(group, prefix string) (Row, bool) {
	for _, row := range r.Rows {
		if row.Group == group && strings.HasPrefix(row.Name, prefix) {
			return row, true
		}
	}
	return Row{}, false
}

func num(v float64, unit string) string {
	if math.IsNaN(v) {
		return "–"
	}
	var s string
	switch {
	case v >= 1000:
		s = fmt.Sprintf("%.0f", v)
	case v >= 100:
		s = fmt.Sprintf("%.1f", v)
	default:
		s = fmt.Sprintf("%.2f", v)
	}
	return s + " " + unit
}

func ratioStr(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.2f×", v)
}

// Markdown writes the report as Markdown.
func (r *Report) Markdown(w io.Writer) error {
	bw := bufio.NewWriter(w)
	m := r.Machine
	mode := "full"
	if m.Smoke {
		mode = "smoke (small counts: the numbers are not meaningful)"
	}
	fmt.Fprintf(bw, "# ipledger benchmark\n\n")
	fmt.Fprintf(bw, "Run %s on `%s`: %s, %d cores, %d MiB, kernel %s, %s; Debian CNI plugins %s; binaries from `%s`. Mode: %s; took %s.\n\n",
		m.Time.UTC().Format(time.RFC3339), m.Host, m.CPU, m.Cores, m.MemoryMiB, m.Kernel, m.Go, m.CNIPlugins, m.BinDir, mode, r.Duration.Round(time.Second))
	fmt.Fprintf(bw, "Baseline: Debian's host-local (IPAM rows) or ptp with host-local (main plugin rows). Floor: exec of a no-op static Go binary through the same harness, measured interleaved with the row. Every exec is a new process with CNI_* in the environment and the network configuration on stdin, timed from fork to reaped.\n\n")
	fmt.Fprintln(bw, "| Group | Measurement | ipledger | baseline | floor | ipledger / baseline | ipledger / floor |")
	fmt.Fprintln(bw, "|---|---|---:|---:|---:|---:|---:|")
	for _, row := range r.Rows {
		fmt.Fprintf(bw, "| %s | %s | %s | %s | %s | %s | %s |\n", row.Group, row.Name,
			num(row.IPledger, row.Unit), num(row.Baseline, row.Unit), num(row.Floor, row.Unit),
			ratioStr(row.VsBaseline()), ratioStr(row.VsFloor()))
	}
	if len(r.Targets) > 0 {
		fmt.Fprintln(bw, "\n## Goals\n\nGoals of the benchmark, not tests: nothing fails on them.\n\n| Goal | This run | Met |\n|---|---|---|")
		for _, t := range r.Targets {
			met := "no"
			if t.Met {
				met = "yes"
			}
			fmt.Fprintf(bw, "| %s | %s | %s |\n", t.Goal, t.Measured, met)
		}
	}
	if len(r.Notes) > 0 {
		fmt.Fprint(bw, "\n## Notes\n\n")
		for _, n := range r.Notes {
			fmt.Fprintf(bw, "- %s\n", n)
		}
	}
	return bw.Flush()
}

func machineInfo(o Options) Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version(), Smoke: o.Smoke, Time: time.Now()}
	m.Host, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int
		for _, l := range strings.Split(string(b), "\n") {
			if _, err := fmt.Sscanf(l, "MemTotal: %d kB", &kb); err == nil {
				m.MemoryMiB = kb / 1024
				break
			}
		}
	}
	m.CNIPlugins = "unknown"
	if out, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "containernetworking-plugins").Output(); err == nil {
		m.CNIPlugins = strings.TrimSpace(string(out))
	}
	return m
}

// Row names the goals refer to.
const (
	groupIPAM   = "IPAM exec"
	groupBurst  = "Burst of concurrent ADDs"
	groupMain   = "Main plugin, real netns"
	groupLedger = "In-process"
	groupBinary = "Plugin binary"
)

// boundName names the lower bound's row at a fill (the bound does not depend on it;
// it is measured in each fill's loop to sit beside that loop's floor).
func boundName(pct int, q string, bits int) string {
	return fmt.Sprintf("lower bound (exec + round trip + fdatasync) %s, beside %d%% of a /%d (baseline host-local DEL)", q, pct, bits)
}

func fillName(verb string, pct int, q string, bits int) string {
	return fmt.Sprintf("%s %s, %d%% of a /%d", verb, q, pct, bits)
}

// targets evaluates the goals of the issue against the rows.
func targets(r *Report, bits int) []Target {
	var out []Target
	for _, verb := range []string{"ADD", "DEL"} {
		worst, at := nan, 0
		for _, pct := range fills {
			row, ok := r.Find(groupIPAM, fillName(verb, pct, "p50", bits))
			if !ok {
				continue
			}
			if v := row.VsFloor(); math.IsNaN(worst) || v > worst {
				worst, at = v, pct
			}
		}
		if !math.IsNaN(worst) {
			out = append(out, Target{Goal: fmt.Sprintf("ipledger %s p50 ≤ 1.5× the exec floor at every fill", verb),
				Measured: fmt.Sprintf("worst %.2f× (at %d%%)", worst, at), Met: worst <= 1.5, Value: worst})
		}
		lo, ok1 := r.Find(groupIPAM, fillName(verb, 0, "p50", bits))
		hi, ok2 := r.Find(groupIPAM, fillName(verb, fills[len(fills)-1], "p50", bits))
		if ok1 && ok2 {
			v := ratio(hi.IPledger, lo.IPledger)
			out = append(out, Target{Goal: fmt.Sprintf("ipledger %s p50 at 95%% fill ≤ 1.2× its 0%% figure", verb),
				Measured: fmt.Sprintf("%.2f×", v), Met: v <= 1.2, Value: v})
		}
	}
	if row, ok := r.Find(groupBurst, burstName("ADD")); ok {
		v := row.VsBaseline()
		out = append(out, Target{Goal: "burst of concurrent ADDs ≤ 0.7× host-local's wall time",
			Measured: fmt.Sprintf("%.2f×", v), Met: v <= 0.7, Value: v})
	}
	if row, ok := r.Find(groupLedger, reconcileCPUName(10000)+", CPU"); ok {
		out = append(out, Target{Goal: "reconcile pass over 10,000 leases < 100 ms of CPU",
			Measured: num(row.IPledger, row.Unit), Met: row.IPledger < 100, Value: row.IPledger})
	}
	if row, ok := r.findPrefix(groupLedger, rssName); ok {
		out = append(out, Target{Goal: "agent RSS at 64k leases < 100 MiB",
			Measured: num(row.IPledger, row.Unit), Met: row.IPledger < 100, Value: row.IPledger})
	}
	return out
}
