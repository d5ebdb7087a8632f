package ctl

import (
	"errors"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/ipledger/ipledger/internal/api"
)

// fetchCluster asks one agent for cluster mode's view (its node name and the
// datastore's blocks).
func fetchCluster(env *Env, socket string) (*api.Cluster, error) {
	resp, err := call(env, socket, api.Request{Op: api.OpBlocks})
	if err != nil {
		return nil, err
	}
	if resp.Cluster == nil {
		return nil, errors.New("agent answered without its cluster view")
	}
	return resp.Cluster, nil
}

func blocks(env *Env, socket string, args []string) int {
	fs := flag.NewFlagSet("blocks", flag.ContinueOnError)
	out := outputFlag(fs)
	network := fs.String("network", "", "only this network")
	if !parseFlags(env, fs, args, out) {
		return ExitError
	}
	c, err := fetchCluster(env, socket)
	if err != nil {
		return fail(env, err)
	}
	if c.Degraded {
		fmt.Fprintf(env.Stderr, "ipledgerctl: node %s is degraded: %s\n", c.Node, c.Reason)
	}
	bs := []api.BlockView{}
	for _, b := range c.Blocks {
		if *network == "" || b.Network == *network {
			bs = append(bs, b)
		}
	}
	sort.SliceStable(bs, func(i, j int) bool { return bs[i].Network < bs[j].Network })
	if printStructured(env, *out, bs) {
		return ExitOK
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, BlockHeader)
	for _, b := range bs {
		fmt.Fprintln(tw, BlockRow(b))
	}
	tw.Flush()
	return ExitOK
}

// BlockHeader is the blocks table's header, its columns separated by tabs.
const BlockHeader = "NETWORK\tBLOCK\tOWNER\tEPOCH\tSTATE\tUSED\tFREE"

// BlockRow is b's row of the blocks table (columns separated by tabs, as
// BlockHeader's).
func BlockRow(b api.BlockView) string {
	count := func(p *int) string {
		if p == nil {
			return "-"
		}
		return strconv.Itoa(*p)
	}
	return fmt.Sprintf("%s\t%s\t%s\t%d\t%s\t%s\t%s", b.Network, b.Block, orDash(b.Owner), b.Epoch, b.State, count(b.Used), count(b.Free))
}

// sockets is a repeatable --socket flag that also takes comma-separated lists.
type sockets []string

func (s *sockets) String() string { return strings.Join(*s, ",") }

func (s *sockets) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*s = append(*s, p)
		}
	}
	return nil
}

func clusterAudit(env *Env, socket string, args []string) int {
	fs := flag.NewFlagSet("cluster-audit", flag.ContinueOnError)
	out := outputFlag(fs)
	var socks sockets
	fs.Var(&socks, "socket", "an agent's socket, one per node (repeat the flag, or give a comma-separated list); default the global --socket")
	if !parseFlags(env, fs, args, out) {
		return ExitError
	}
	if len(socks) == 0 {
		socks = sockets{socket}
	}
	var nodes []NodeLeases
	var view *api.Cluster
	var viewErr error
	for _, s := range socks {
		c, err := fetchCluster(env, s)
		if err != nil {
			return fail(env, fmt.Errorf("cluster-audit: %s: %w", s, err))
		}
		ls, err := fetchLeases(env, s, "")
		if err != nil {
			return fail(env, fmt.Errorf("cluster-audit: %s: %w", s, err))
		}
		nodes = append(nodes, NodeLeases{Node: c.Node, Socket: s, Leases: ls})
		if view == nil && !c.Degraded {
			view = c
		}
	}
	if view == nil {
		// every agent reported trouble with the datastore: a listing is still the
		// datastore's, if one answered it
		for _, s := range socks {
			if view, viewErr = fetchCluster(env, s); viewErr == nil {
				break
			}
		}
		if view == nil {
			return fail(env, fmt.Errorf("cluster-audit: no agent could list the datastore's blocks: %w", viewErr))
		}
	}
	rep := AuditCluster(nodes, view.Blocks)
	if !printStructured(env, *out, rep) {
		verdict := "NO ADDRESS HELD TWICE"
		if !rep.OK {
			verdict = "NOT BALANCED"
		}
		fmt.Fprintf(env.Stdout, "%s: %d nodes, %d leases, %d blocks, %d double-assigned, %d in lost blocks\n", verdict, len(rep.Nodes), rep.Leases, rep.Blocks, rep.DoubleAssigned, rep.Lost)
		for _, p := range rep.Problems {
			fmt.Fprintf(env.Stdout, "  %s\n", p)
		}
		for _, p := range rep.StaleBorrows {
			fmt.Fprintf(env.Stdout, "  stale borrow: %s\n", p)
		}
	}
	if !rep.OK {
		return ExitUnbalanced
	}
	return ExitOK
}
