package fleet

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ctl"
)

func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// answered calls f with each node's decoded answer, in node order; a node whose
// answer does not decode as v's type is an error.
func answered[T any](results []NodeResult, f func(r *NodeResult, v T)) error {
	for i := range results {
		r := &results[i]
		if r.err != nil {
			continue
		}
		var v T
		if err := json.Unmarshal(r.Result, &v); err != nil {
			return fmt.Errorf("node %s: the agent's answer: %w", r.Node, err)
		}
		f(r, v)
	}
	return nil
}

// leasesTable: ipledgerctl's leases table with the node first.
func leasesTable(w io.Writer, results []NodeResult, now time.Time) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "NODE\t"+ctl.LeaseHeader)
	err := answered(results, func(r *NodeResult, ls []api.LeaseView) {
		for _, l := range ls {
			fmt.Fprintln(tw, r.Node+"\t"+ctl.LeaseRow(l, now))
		}
	})
	tw.Flush()
	return err
}

// auditAnswer is `ipledgerctl audit -o json`.
type auditAnswer struct {
	api.Audit
	Explanations []ctl.Explanation `json:"explanations"`
}

// auditTable: a row per node, a node that could not be asked included
// (UNREACHABLE), with ipledgerctl audit's counts; below it each node's pools'
// books and the explanations, prefixed with the node.
func auditTable(w io.Writer, results []NodeResult) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "NODE\tBOOKS\tLIVE\tSUSPECT\tSTRANDED\tLEAKED\tDOUBLE-ASSIGNED\tRUNTIME")
	var notes []string
	for i := range results {
		r := &results[i]
		if r.err != nil {
			fmt.Fprintf(tw, "%s\tUNREACHABLE\t-\t-\t-\t-\t-\t-\n", r.Node)
			continue
		}
		var a auditAnswer
		if err := json.Unmarshal(r.Result, &a); err != nil {
			tw.Flush()
			return fmt.Errorf("node %s: the agent's answer: %w", r.Node, err)
		}
		books := "BALANCED"
		if !a.OK {
			books = "NOT BALANCED"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", r.Node, books, a.Live, a.Suspect, a.Stranded, a.Leaked, a.DoubleAssigned, a.Runtime)
		for _, p := range a.Pools {
			notes = append(notes, r.Node+": "+ctl.PoolBooks(p))
		}
		for _, e := range a.Explanations {
			notes = append(notes, r.Node+": "+e.Text)
		}
	}
	tw.Flush()
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	return nil
}

// doctorTable: every node's checks, a line each.
func doctorTable(w io.Writer, results []NodeResult) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "NODE\tLEVEL\tCHECK")
	err := answered(results, func(r *NodeResult, d ctl.DoctorOutput) {
		for _, c := range d.Checks {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Node, c.Level, c.Text)
		}
	})
	tw.Flush()
	return err
}

// blocksTable: every block once, under the node that owns it (its used and free
// addresses are that node's ledger's: only the owner knows them); a node's lost
// block also under that node. A block no answering node owns (free, or its owner
// could not be asked) is shown under the first node that listed it.
func blocksTable(w io.Writer, results []NodeResult) error {
	type row struct {
		node string
		b    api.BlockView
	}
	var claimed, rest []row
	shown := map[string]bool{}
	err := answered(results, func(r *NodeResult, bs []api.BlockView) {
		for _, b := range bs {
			switch b.State {
			case api.BlockOwned, api.BlockSuspended, api.BlockLost:
				claimed = append(claimed, row{r.Node, b})
				shown[b.Network+" "+b.Block] = true
			default:
				rest = append(rest, row{r.Node, b})
			}
		}
	})
	if err != nil {
		return err
	}
	rows := claimed
	for _, x := range rest {
		if k := x.b.Network + " " + x.b.Block; !shown[k] {
			shown[k] = true
			rows = append(rows, x)
		}
	}
	order := map[string]int{}
	for i := range results {
		order[results[i].Node] = i
	}
	sort.SliceStable(rows, func(i, j int) bool { return order[rows[i].node] < order[rows[j].node] })
	tw := newTable(w)
	fmt.Fprintln(tw, "NODE\t"+ctl.BlockHeader)
	for _, x := range rows {
		fmt.Fprintln(tw, x.node+"\t"+ctl.BlockRow(x.b))
	}
	return tw.Flush()
}
