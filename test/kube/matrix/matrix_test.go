package matrix

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAppendReadTableSplice: cells appended by two runs read back in order,
// render as rows, and replace only what is between the markers.
func TestAppendReadTableSplice(t *testing.T) {
	p := filepath.Join(t.TempDir(), "cells.jsonl")
	when := time.Date(2026, 11, 27, 7, 30, 0, 0, time.UTC)
	for _, c := range []Cell{
		{Runtime: "containerd v2.2.1", Scenario: "containerd#10744", Date: when, Sandboxes: 6, HostLocalLeaked: 3, Reclaim: "14s", Note: "DEL for 0 of 3 lost sandboxes"},
		{Runtime: "containerd v2.3.7", Scenario: "containerd#10744", Date: when, Sandboxes: 6, Reclaim: "12s"},
	} {
		if err := Append(p, c); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cs, err := Read(f)
	if err != nil || len(cs) != 2 {
		t.Fatalf("Read = %d cells, %v", len(cs), err)
	}
	tab := Table(cs, "2 cores")
	for _, want := range []string{
		"Run of 2026-11-27 07:30 UTC on 2 cores.",
		"| containerd v2.2.1 | containerd#10744 | 6 | 3 | 0 | 0 | 14s | DEL for 0 of 3 lost sandboxes |",
		"| containerd v2.3.7 | containerd#10744 | 6 | 0 | 0 | 0 | 12s |  |",
	} {
		if !strings.Contains(tab, want) {
			t.Errorf("table lacks %q:\n%s", want, tab)
		}
	}
	doc := "# Runtimes\n\nbefore\n" + Begin + "\nold table\n" + End + "\nafter\n"
	out, err := Splice(doc, tab)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "old table") || !strings.HasPrefix(out, "# Runtimes\n\nbefore\n"+Begin+"\nRun of") || !strings.HasSuffix(out, "|\n"+End+"\nafter\n") {
		t.Errorf("spliced:\n%s", out)
	}
}

// TestSpliceNoMarkers: a document without the markers is an error naming them.
func TestSpliceNoMarkers(t *testing.T) {
	_, err := Splice("# Runtimes\n", "| t |\n")
	if !errors.Is(err, ErrNoMarkers) || !strings.Contains(err.Error(), Begin) {
		t.Fatalf("err = %v", err)
	}
}

// TestReadBadLine: a line that is not a cell is an error naming the line.
func TestReadBadLine(t *testing.T) {
	_, err := Read(strings.NewReader("{}\nnot json\n"))
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("err = %v", err)
	}
}
