// Command kubectl-ipledger is the kubectl plugin (`kubectl ipledger ...`): ipledgerctl's
// leases, audit, doctor and blocks over every node of the cluster, through the API
// server.
package main

import (
	"os"

	"github.com/ipledger/ipledger/internal/fleet"
)

func main() {
	os.Exit(fleet.Main(&fleet.Env{Stdout: os.Stdout, Stderr: os.Stderr, Connect: fleet.Connect}, os.Args[1:]))
}
