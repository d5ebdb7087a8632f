package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/ipledger/ipledger/internal/ctl"
	"github.com/ipledger/ipledger/internal/sim"
)

// simCmd is `ipledgerctl sim`: the incident simulator (internal/sim).
func simCmd(env *ctl.Env, _ string, args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tty := false
	if f, ok := env.Stderr.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	return sim.Main(ctx, args, env.Stdout, env.Stderr, tty)
}
