package cluster_test

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMain fails the package when its agents, which run in the host's
// namespaces, left ipledger's node network there: routes of protocol 201 or
// the nft table inet ipledger that the host did not have before (every agent
// here runs with hostNetworkOff).
//
// Under -short the etcd tests run side by side (sideBySideWhenShort), all of
// them at once unless -parallel is given: go test's default, GOMAXPROCS, would
// run two at a time on a 2-core machine, and they wait on timers, not CPU.
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() && !flagSet("test.parallel") {
		flag.Set("test.parallel", "16")
	}
	before := hostNetwork()
	code := m.Run()
	if after := hostNetwork(); after != before {
		fmt.Fprintf(os.Stderr, "test/cluster: the host's node network changed (agents without hostNetworkOff?):\nbefore: %s\nafter:  %s\n", before, after)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// flagSet: the flag name was given on the command line.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// hostNetwork describes ipledger's routes and nft table on the host.
func hostNetwork() string {
	routes, _ := exec.Command("ip", "route", "show", "proto", "201").CombinedOutput()
	table := "no inet ipledger table"
	if exec.Command("nft", "list", "table", "inet", "ipledger").Run() == nil {
		table = "inet ipledger table present"
	}
	return fmt.Sprintf("routes %q, %s", strings.TrimSpace(string(routes)), table)
}
