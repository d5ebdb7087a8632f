// Command matrixdoc writes the runtime matrix (make runtime-matrix) into
// docs/runtimes.md: the cells test/kube's scenarios appended to a JSON-lines
// file (IPLEDGER_MATRIX_OUT) replace the table between the document's matrix
// markers, under a line naming the run's date and machine.
//
//	go run ./test/kube/matrixdoc -in cells.jsonl -doc docs/runtimes.md
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"github.com/ipledger/ipledger/test/kube/matrix"
)

func main() {
	in := flag.String("in", "", "the cells, one JSON object a line (what IPLEDGER_MATRIX_OUT named)")
	doc := flag.String("doc", "docs/runtimes.md", "the document holding the matrix markers")
	flag.Parse()
	if err := run(*in, *doc); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(in, doc string) error {
	if in == "" {
		return fmt.Errorf("matrixdoc: -in is required: the file the test runs appended their cells to (IPLEDGER_MATRIX_OUT)")
	}
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	cs, err := matrix.Read(f)
	if err != nil {
		return err
	}
	d, err := os.ReadFile(doc)
	if err != nil {
		return err
	}
	out, err := matrix.Splice(string(d), matrix.Table(cs, machine()))
	if err != nil {
		return fmt.Errorf("%s: %w", doc, err)
	}
	return os.WriteFile(doc, []byte(out), 0o644)
}

// machine describes this machine: host name, cores, kernel, cgroup version.
func machine() string {
	host, _ := os.Hostname()
	kernel, _ := exec.Command("uname", "-r").Output()
	cg := "cgroup v1"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		cg = "cgroup v2"
	}
	return fmt.Sprintf("%s (%d cores, Linux %s, %s)", host, runtime.NumCPU(), strings.TrimSpace(string(kernel)), cg)
}
