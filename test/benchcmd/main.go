// Command benchcmd runs the side-by-side benchmark (make bench, make bench-smoke):
//
//	go run ./test/benchcmd [--smoke] [--only STEPS] [--out FILE] [--bin DIR] [-v]
//
// It lives outside cmd/ so that the binaries operators install (ipledgerctl among
// them) link neither the benchmark harness nor the test environment it starts.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/ipledger/ipledger/internal/bench"
)

const usage = `usage: go run ./test/benchcmd [--smoke] [--only STEPS] [--out FILE] [--bin DIR] [-v]

Runs the benchmark (as root; needs iproute2, Debian's CNI plugins in /usr/lib/cni and
a Go toolchain in this source tree) and prints a Markdown table to stdout (and FILE).
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	smoke := fs.Bool("smoke", false, "small counts, a few seconds: checks the harness, the numbers mean little")
	out := fs.String("out", "", "also write the Markdown report to this file")
	binDir := fs.String("bin", "", "directory of the ipledger and ipledger-veth binaries to measure (default: build them from source)")
	verbose := fs.Bool("v", false, "progress on stderr")
	only := fs.String("only", "", "comma-separated steps to run (binaries, ipam-latency, ipam-burst, main-plugin, ledger, agent-rss, reconcile); default all")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	var steps []string
	if *only != "" {
		steps = strings.Split(*only, ",")
	}
	rep, err := bench.Run(ctx, bench.Options{Smoke: *smoke, BinDir: *binDir, Steps: steps,
		Log: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))})
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}
	var md bytes.Buffer
	rep.Markdown(&md)
	stdout.Write(md.Bytes())
	if *out != "" {
		if err := os.WriteFile(*out, md.Bytes(), 0o644); err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 2
		}
	}
	return 0
}
