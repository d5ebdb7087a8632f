package sim

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Exit statuses of `ipledgerctl sim`, as the CLI's.
const (
	exitOK         = 0
	exitUnbalanced = 1
	exitError      = 2
)

const usage = `usage: ipledgerctl sim [--scenario S] [--pods N] [--seed K] [--pool CIDR] [--reserve CIDRS] [-o table|json]

Replays the incidents ipledger exists to end, at scale, on a simulated clock: a model of
kubelet, the container runtime and the CNI chain drives ipledger's real ledger, agent,
reconciler and supersession in process, and the real host-local binary as a baseline.
Scenarios: %s, all.
Exit status: 0 when ipledger ended balanced in every scenario, 1 when not, 2 on error.

`

// Main is `ipledgerctl sim`: it parses args, runs, and prints to stdout; progress goes
// to stderr when tty says stderr is a terminal.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer, tty bool) int {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintf(stderr, usage, strings.Join(Scenarios, ", ")); fs.PrintDefaults() }
	var o Options
	fs.StringVar(&o.Scenario, "scenario", "mix", "scenario to run, or all")
	fs.IntVar(&o.Pods, "pods", 100000, "pods that come and go (the crash-loop scenario has its own)")
	fs.Uint64Var(&o.Seed, "seed", 1, "random seed; a seed replays the same run")
	fs.StringVar(&o.Pool, "pool", "", "the network's subnet (default 10.64.0.0/16; crashloop-recreate: its incident's 32 addresses)")
	fs.IntVar(&o.BaselinePods, "baseline-pods", 1000, "pods for the host-local baseline (each call execs it); 0 skips it")
	fs.StringVar(&o.HostLocal, "host-local", HostLocalPath, "the host-local binary of the baseline")
	fs.Func("reserve", "comma-separated addresses and CIDRs no pod may get (ipledger's ipam.exclude); ADDs answered with one count as reservedHits", func(v string) error {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				o.Reserve = append(o.Reserve, f)
			}
		}
		return nil
	})
	out := fs.String("o", "table", "output: table or json")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitError
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ipledgerctl sim: unexpected arguments %q\n", fs.Args())
		return exitError
	}
	if *out != "table" && *out != "json" {
		fmt.Fprintf(stderr, "ipledgerctl sim: -o %q: use table or json\n", *out)
		return exitError
	}
	if tty {
		o.Progress = progressBar(stderr)
	}
	res, err := Run(ctx, o)
	if tty {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if err != nil {
		fmt.Fprintln(stderr, "ipledgerctl sim:", err)
		return exitError
	}
	if *out == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			fmt.Fprintln(stderr, "ipledgerctl sim:", err)
			return exitError
		}
	} else {
		Table(stdout, res)
		if len(o.Reserve) > 0 {
			for _, r := range res {
				fmt.Fprintf(stdout, "reserved %s: %s %s answered %d ADDs with a reserved address\n", strings.Join(o.Reserve, ","), r.Scenario, r.System, r.ReservedHits)
			}
		}
	}
	for _, r := range res {
		if r.System == "ipledger" && !r.Balanced() {
			return exitUnbalanced
		}
	}
	return exitOK
}

// Table prints results for people, with the notes below.
func Table(w io.Writer, res []Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tsystem\tpods\tlifecycles\tleakedAtEnd\tfalseReleases\tdoubleAssigned\texhaustion\tpeakLive\treclaim p50/p99 s\twall s\t")
	for _, r := range res {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.0f/%.0f\t%.1f\t\n", r.Scenario, r.System, r.Pods, r.Lifecycles,
			r.LeakedAtEnd, r.FalseReleases, r.DoubleAssigned, r.ExhaustionEvents, r.PeakLive, r.ReclaimP50, r.ReclaimP99, r.WallSeconds)
	}
	tw.Flush()
	for _, r := range res {
		if r.Note != "" {
			fmt.Fprintf(w, "note: %s %s: %s\n", r.Scenario, r.System, r.Note)
		}
	}
}

// progressBar draws one line on a terminal, rewritten as runs progress.
func progressBar(w io.Writer) func(system, scenario string, done float64) {
	last := ""
	return func(system, scenario string, done float64) {
		key := fmt.Sprintf("%s %s %.0f", system, scenario, done*100)
		if key == last {
			return // redraw only when the line changes
		}
		last = key
		const width = 30
		n := int(done * width)
		fmt.Fprintf(w, "\r\033[K%-18s %-10s [%s%s] %3.0f%%", scenario, system, strings.Repeat("#", n), strings.Repeat(".", width-n), done*100)
	}
}
