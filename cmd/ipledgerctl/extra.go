package main

import "github.com/ipledger/ipledger/internal/ctl"

// extra holds the commands that need more than the agent's API (demo, sim, bench).
var extra = map[string]func(env *ctl.Env, socket string, args []string) int{
	"bench": benchCmd,
	"sim":   simCmd,
}
