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

	"sigs.k8s.io/yaml"

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
	Call           api.CallFunc
	// Now is the wall clock (ages); default time.Now.
	Now func() time.Time
	// Loopback reports whether the loopback interface of the network namespace at
	// path is UP (doctor); default LoopbackUp.
	Loopback func(path string) (bool, error)
	// Commands beyond the agent's reads (demo, sim) register here.
	Extra map[string]func(env *Env, socket string, args []string) int
}

func (env *Env) now() time.Time {
	if env.Now != nil {
		return env.Now()
	}
	return time.Now()
}

const usage = `usage: ipledgerctl [--socket PATH] COMMAND [flags]

commands:
  leases   [-o table|json|yaml] [--network NAME] [--pod [NAMESPACE/]NAME|UID]
                                                   live leases with their age and sandbox state
  audit    [-o table|json|yaml]                    check the books and explain every suspect,
                                                   stranded or leaked lease; exit 0 balanced, 1 not, 2 error
  history  --network NAME --ip ADDR [-o table|json|yaml]
                                                   who held an address and why it was released
  release  --network NAME --container-id ID [--ifname eth0] [--reason TEXT]
           [--force-release-ready-sandbox]         release a lease by hand (reason manual); the
                                                   agent asks the runtime first and refuses a
                                                   sandbox that is READY (or that it cannot ask)
  pools    [-o table|json|yaml]                    pool usage
  doctor   [--netns PATH] [-o table|json|yaml]     what is wrong on this node: one line per check,
                                                   OK/WARN/FAIL with the fix; exit 0, 1 (WARN), 2 (FAIL)
  blocks   [-o table|json|yaml] [--network NAME]  cluster mode: the datastore's address blocks,
                                                   owner, epoch, and this node's used/free
  cluster-audit --socket S1 --socket S2 ... [-o table|json|yaml]
                                                   cluster mode: every node's leases against each
                                                   other and the blocks; exit 0 when no address is
                                                   held twice and every lease lies in its node's
                                                   block (or one flagged lost), 1 not, 2 error
  sim      --scenario S [--pods N] [--seed K] [--pool CIDR] [-o table|json]
                                                   the incident simulator: the seeds replayed at
                                                   scale on ipledger and on host-local (no agent needed)
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
	case "doctor":
		return doctor(env, *socket, rest)
	case "blocks":
		return blocks(env, *socket, rest)
	case "cluster-audit":
		return clusterAudit(env, *socket, rest)
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
	return fs.String("o", "table", "output: table, json or yaml")
}

func parseFlags(env *Env, fs *flag.FlagSet, args []string, out *string) bool {
	fs.SetOutput(env.Stderr)
	if err := fs.Parse(args); err != nil {
		return false
	}
	if out != nil && *out != "table" && *out != "json" && *out != "yaml" {
		fmt.Fprintf(env.Stderr, "ipledgerctl: -o %q: use table, json or yaml\n", *out)
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

// printStructured prints v as JSON or YAML (the same fields: YAML is made from the
// JSON encoding, so the json tags name both); false for table output.
func printStructured(env *Env, format string, v any) bool {
	switch format {
	case "json":
		printJSON(env.Stdout, v)
		return true
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			fmt.Fprintln(env.Stderr, "ipledgerctl: yaml:", err)
			return true
		}
		env.Stdout.Write(b)
		return true
	}
	return false
}

func fail(env *Env, err error) int {
	fmt.Fprintln(env.Stderr, "ipledgerctl:", err)
	return ExitError
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
	h := resp.History
	if h == nil {
		h = []api.Release{}
	}
	if printStructured(env, *out, h) {
		return ExitOK
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FROM\tTO\tCONTAINER\tIFNAME\tPOD\tREASON\tDETAIL\tWHY")
	for _, r := range resp.History {
		pod := "-"
		if r.Pod.Name != "" {
			pod = r.Pod.Namespace + "/" + r.Pod.Name
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.From.Format(time.RFC3339), r.To.Format(time.RFC3339), short(r.Key.ContainerID), r.Key.IfName, pod, r.Reason, orDash(r.Detail), orDash(r.Why))
	}
	tw.Flush()
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
	if printStructured(env, *out, ps) {
		return ExitOK
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NETWORK\tLIVE\tFREE\tALLOCATIONS\tRELEASES\tDRAINED")
	for _, p := range ps {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", p.Network, p.Live, p.Free, p.Allocations, p.Releases, orDash(strings.Join(p.Drained, ",")))
	}
	tw.Flush()
	// each draining block, with what still holds it
	for _, p := range ps {
		for _, b := range p.Draining {
			held := "held by nothing: given back once the reuse delay has passed since its last release"
			if b.Leases > 0 {
				held = fmt.Sprintf("held by %d leases: %s", b.Leases, strings.Join(b.Pods, ", "))
			}
			state := "draining"
			if b.RangeInPool {
				state = "draining (its range is back in the pool; claimable again once given back)"
			}
			fmt.Fprintf(env.Stdout, "%s: block %s %s, %s\n", p.Network, b.Block, state, held)
		}
	}
	return ExitOK
}
