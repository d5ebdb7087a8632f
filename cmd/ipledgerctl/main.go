// Command ipledgerctl is the operator CLI.
package main

import (
	"os"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ctl"
)

func main() {
	os.Exit(ctl.Main(&ctl.Env{Stdout: os.Stdout, Stderr: os.Stderr, Call: api.Call,
		Extra: map[string]func(env *ctl.Env, socket string, args []string) int{"sim": simCmd}}, os.Args[1:]))
}
