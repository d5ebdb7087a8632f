package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/ipledger/ipledger/internal/bench"
	"github.com/ipledger/ipledger/internal/ctl"
)

const benchUsage = `usage: ipledgerctl bench [--smoke] [--out FILE] [--bin DIR] [-v]

Runs the benchmark (as root; needs iproute2, Debian's CNI plugins in /usr/lib/cni and
a Go toolchain in this source tree) and prints a Markdown table to stdout (and FILE).
`

// benchCmd is `ipledgerctl bench`.
func benchCmd(env *ctl.Env, _ string, args []string) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	fs.Usage = func() { fmt.Fprint(env.Stderr, benchUsage); fs.PrintDefaults() }
	smoke := fs.Bool("smoke", false, "small counts, a few seconds: checks the harness, the numbers mean little")
	out := fs.String("out", "", "also write the Markdown report to this file")
	binDir := fs.String("bin", "", "directory of the ipledger and ipledger-veth binaries to measure (default: build them from source)")
	verbose := fs.Bool("v", false, "progress on stderr")
	if err := fs.Parse(args); err != nil {
		return ctl.ExitError
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(env.Stderr, "ipledgerctl bench: unexpected arguments %q\n", fs.Args())
		return ctl.ExitError
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := bench.Run(ctx, bench.Options{Smoke: *smoke, BinDir: *binDir,
		Log: slog.New(slog.NewTextHandler(env.Stderr, &slog.HandlerOptions{Level: level}))})
	if err != nil {
		fmt.Fprintln(env.Stderr, "ipledgerctl bench:", err)
		return ctl.ExitError
	}
	var md bytes.Buffer
	rep.Markdown(&md)
	env.Stdout.Write(md.Bytes())
	if *out != "" {
		if err := os.WriteFile(*out, md.Bytes(), 0o644); err != nil {
			fmt.Fprintln(env.Stderr, "ipledgerctl bench:", err)
			return ctl.ExitError
		}
	}
	return ctl.ExitOK
}
