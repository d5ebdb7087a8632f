// Package matrix holds the runtime matrix's cells (make runtime-matrix):
// test/kube's scenarios append one Cell a scenario to a JSON-lines file and
// test/kube/matrixdoc renders the file into docs/runtimes.md.
package matrix

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Begin and End mark the table in docs/runtimes.md.
const (
	Begin = "<!-- matrix:begin (make runtime-matrix writes this table) -->"
	End   = "<!-- matrix:end -->"
)

// Cell is one scenario's figures on one runtime: what the host-local control
// kept under the same runtime events, what ipledger kept (must be 0), the
// leases released while their sandbox was READY (must be 0) and the time an
// address of a failed or lost sandbox stayed held at the longest.
type Cell struct {
	Runtime  string    `json:"runtime"`
	Scenario string    `json:"scenario"`
	Date     time.Time `json:"date"`
	// Sandboxes is how many sandboxes the scenario made (ADDs seen).
	Sandboxes       int    `json:"sandboxes"`
	HostLocalLeaked int    `json:"hostLocalLeaked"`
	IpledgerLeaked  int    `json:"ipledgerLeaked"`
	FalseReleases   int    `json:"falseReleases"`
	Reclaim         string `json:"reclaim"`
	Note            string `json:"note,omitempty"`
}

// Append writes c as one line at the end of the file path.
func Append(path string, c Cell) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Read parses the cells of r, one JSON object a line.
func Read(r io.Reader) ([]Cell, error) {
	var cs []Cell
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var c Cell
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return nil, fmt.Errorf("matrix: line %d: %w", line, err)
		}
		cs = append(cs, c)
	}
	return cs, sc.Err()
}

// Table renders cs in the order run, under a line naming the run's date and
// machine.
func Table(cs []Cell, machine string) string {
	var b strings.Builder
	date := "no run"
	if len(cs) > 0 {
		date = cs[0].Date.UTC().Format("2006-01-02 15:04 UTC")
	}
	fmt.Fprintf(&b, "Run of %s on %s.\n\n", date, machine)
	b.WriteString("| runtime | scenario | sandboxes | leaked by host-local (control) | leaked by ipledger | false releases | time to reclaim | notes |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, c := range cs {
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %s | %s |\n", c.Runtime, c.Scenario, c.Sandboxes, c.HostLocalLeaked, c.IpledgerLeaked, c.FalseReleases, c.Reclaim, c.Note)
	}
	return b.String()
}

// Splice puts table between doc's markers, replacing what was there.
func Splice(doc, table string) (string, error) {
	i, j := strings.Index(doc, Begin), strings.Index(doc, End)
	if i < 0 || j < i {
		return "", fmt.Errorf("%w: add the lines %q and %q where the table goes", ErrNoMarkers, Begin, End)
	}
	return doc[:i+len(Begin)] + "\n" + table + doc[j:], nil
}
