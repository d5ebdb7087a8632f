// Package ctl is the operator CLI, ipledgerctl: it reads the ledger through the agent
// and prints it for people (tables) and tools (-o json).
package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ipledger/ipledger/internal/api"
)

// Exit statuses.
const (
	ExitOK         = 0
	ExitUnbalanced = 1
	ExitError      = 2
)

// Env is the CLI's process edges.
type Env struct {
	Stdout, Stderr io.Writer
	Call           func(ctx context.Context, socket string, req api.Request) (*api.Response, error)
	// Commands beyond the agent's reads (demo, sim, bench) register here.
	Extra map[string]func(env *Env, socket string, args []string) int
}

const usage = `usage: ipledgerctl [--socket PATH] COMMAND [flags]

commands:
  leases   [-o json|table] [--network NAME]       live leases
  audit    [-o json|table]                         check the books; exit 0 balanced, 1 not, 2 error
  history  --network NAME --ip ADDR [-o json|table] who held an address and why it was released
  release  --network NAME --container-id ID [--ifname eth0] [--reason TEXT]
                                                   release a lease by hand (reason manual)
  pools    [-o json|table]                         pool usage
`

// Main runs the CLI and returns the exit status.
func Main(env *Env, args []string) int {
	fs := flag.NewFlagSet("ipledgerctl", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	socket := fs.String("socket", "/run/ipledger/ipledger.sock", "the agent's socket")
	fs.Usage = func() { fmt.Fprint(env.Stderr, usage) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitError
	}
	if fs.NArg() == 0 {
		fmt.Fprint(env.Stderr, usage)
		return ExitError
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	switch cmd {
	case "leases":
		return leases(env, *socket, rest)
	case "audit":
		return audit(env, *socket, rest)
	case "history":
		return history(env, *socket, rest)
	case "release":
		return release(env, *socket, rest)
	case "pools":
		return pools(env, *socket, rest)
	}
	if f, ok := env.Extra[cmd]; ok {
		return f(env, *socket, rest)
	}
	fmt.Fprintf(env.Stderr, "ipledgerctl: unknown command %q\n%s", cmd, usage)
	return ExitError
}

func call(env *Env, socket string, req api.Request) (*api.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return env.Call(ctx, socket, req)
}

func outputFlag(fs *flag.FlagSet) *string {
	return fs.String("o", "table", "output: table or json")
}

func parseFlags(env *Env, fs *flag.FlagSet, args []string, out *string) bool {
	fs.SetOutput(env.Stderr)
	if err := fs.Parse(args); err != nil {
		return false
	}
	if out != nil && *out != "table" && *out != "json" {
		fmt.Fprintf(env.Stderr, "ipledgerctl: -o %q: use table or json\n", *out)
		return false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(env.Stderr, "ipledgerctl: unexpected arguments %q\n", fs.Args())
		return false
	}
	return true
}

func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func fail(env *Env, err error) int {
	fmt.Fprintln(env.Stderr, "ipledgerctl:", err)
	return ExitError
}

func leases(env *Env, socket string, args []string) int {
	fs := flag.NewFlagSet("leases", flag.ContinueOnError)
	out := outputFlag(fs)
	network := fs.String("network", "", "only this network")
	if !parseFlags(env, fs, args, out) {
		return ExitError
	}
	resp, err := call(env, socket, api.Request{Op: api.OpLeases, Network: *network})
	if err != nil {
		return fail(env, err)
	}
	ls := resp.Leases
	if ls == nil {
		ls = []api.LeaseView{}
	}
	if *out == "json" {
		printJSON(env.Stdout, ls)
		return ExitOK
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NETWORK\tCONTAINER\tIFNAME\tIPS\tPOD\tSINCE\tSANDBOX")
	for _, l := range ls {
		pod := "-"
		if l.Name != "" {
			pod = l.Namespace + "/" + l.Name
		}
		sb := l.Sandbox
		if sb == "" {
			sb = "-"
		}
		if l.Suspect != "" {
			sb += " (" + l.Suspect + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", l.Network, short(l.ContainerID), l.IfName, strings.Join(l.IPs, ","), pod, l.Created.Format(time.RFC3339), sb)
	}
	tw.Flush()
	return ExitOK
}

// short abbreviates runtime-made IDs (64 hex digits) as docker and crictl do.
func short(id string) string {
	if len(id) == 64 && strings.Trim(id, "0123456789abcdef") == "" {
		return id[:13]
	}
	return id
}

func fetchAudit(env *Env, socket string) (*api.Audit, error) {
	resp, err := call(env, socket, api.Request{Op: api.OpAudit})
	if err != nil {
		return nil, err
	}
	if resp.Audit == nil {
		return nil, errors.New("agent answered without an audit")
	}
	return resp.Audit, nil
}

func audit(env *Env, socket string, args []string) int {
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	out := outputFlag(fs)
	if !parseFlags(env, fs, args, out) {
		return ExitError
	}
	a, err := fetchAudit(env, socket)
	if err != nil {
		return fail(env, err)
	}
	if *out == "json" {
		printJSON(env.Stdout, a)
	} else {
		verdict := "BALANCED"
		if !a.OK {
			verdict = "NOT BALANCED"
		}
		fmt.Fprintf(env.Stdout, "%s: live %d, suspect %d, stranded %d, leaked %d, double-assigned %d (runtime: %s)\n", verdict, a.Live, a.Suspect, a.Stranded, a.Leaked, a.DoubleAssigned, a.Runtime)
		for _, p := range a.Pools {
			fmt.Fprintf(env.Stdout, "  pool %s: %d allocations = %d releases + %d live; %d free\n", p.Network, p.Allocations, p.Releases, p.Live, p.Free)
		}
		for _, d := range a.Doubles {
			fmt.Fprintf(env.Stdout, "  DOUBLE %s/%s held by %v\n", d.Network, d.IP, d.Holders)
		}
		for _, s := range a.SuspectLeases {
			fmt.Fprintf(env.Stdout, "  suspect %s/%s/%s %v: %s\n", s.Network, short(s.ContainerID), s.IfName, s.IPs, s.Suspect)
		}
		for _, p := range a.Problems {
			fmt.Fprintf(env.Stdout, "  problem: %s\n", p)
		}
	}
	if !a.OK {
		return ExitUnbalanced
	}
	return ExitOK
}

func history(env *Env, socket string, args []string) int {
	fs := flag.NewFlagSet("history", flag.ContinueOnError)
	out := outputFlag(fs)
	network := fs.String("network", "", "network name (required)")
	ip := fs.String("ip", "", "address (required)")
	if !parseFlags(env, fs, args, out) {
		return ExitError
	}
	if *network == "" || *ip == "" {
		return fail(env, errors.New("history: --network and --ip are required"))
	}
	resp, err := call(env, socket, api.Request{Op: api.OpHistory, Network: *network, IP: *ip})
	if err != nil {
		return fail(env, err)
	}
	if *out == "json" {
		printJSON(env.Stdout, resp.History)
		return ExitOK
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FROM\tTO\tCONTAINER\tIFNAME\tPOD\tREASON\tDETAIL")
	for _, r := range resp.History {
		pod := "-"
		if r.Pod.Name != "" {
			pod = r.Pod.Namespace + "/" + r.Pod.Name
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.From.Format(time.RFC3339), r.To.Format(time.RFC3339), short(r.Key.ContainerID), r.Key.IfName, pod, r.Reason, r.Detail)
	}
	tw.Flush()
	return ExitOK
}

func release(env *Env, socket string, args []string) int {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	network := fs.String("network", "", "network name (required)")
	cid := fs.String("container-id", "", "container (sandbox) ID (required)")
	ifname := fs.String("ifname", "eth0", "interface name")
	reason := fs.String("reason", "", "why, recorded in the address's history")
	if !parseFlags(env, fs, args, nil) {
		return ExitError
	}
	if *network == "" || *cid == "" {
		return fail(env, errors.New("release: --network and --container-id are required"))
	}
	if _, err := call(env, socket, api.Request{Op: api.OpRelease, Network: *network, ContainerID: *cid, IfName: *ifname, Detail: *reason}); err != nil {
		return fail(env, err)
	}
	fmt.Fprintf(env.Stdout, "released %s/%s/%s\n", *network, *cid, *ifname)
	return ExitOK
}

func pools(env *Env, socket string, args []string) int {
	fs := flag.NewFlagSet("pools", flag.ContinueOnError)
	out := outputFlag(fs)
	if !parseFlags(env, fs, args, out) {
		return ExitError
	}
	a, err := fetchAudit(env, socket)
	if err != nil {
		return fail(env, err)
	}
	ps := a.Pools
	sort.Slice(ps, func(i, j int) bool { return ps[i].Network < ps[j].Network })
	if *out == "json" {
		printJSON(env.Stdout, ps)
		return ExitOK
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NETWORK\tLIVE\tFREE\tALLOCATIONS\tRELEASES")
	for _, p := range ps {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", p.Network, p.Live, p.Free, p.Allocations, p.Releases)
	}
	tw.Flush()
	return ExitOK
}
