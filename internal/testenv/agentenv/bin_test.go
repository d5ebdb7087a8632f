package agentenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestBinSharedAcrossProcesses: two more test processes asking for the binaries
// of the same source get this process's directory, without a build of their
// own (go test runs packages as processes side by side; each used to link
// ./cmd/... into a temporary directory of its own).
func TestBinSharedAcrossProcesses(t *testing.T) {
	dir := Bin(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		cmd := exec.Command(exe, "-test.run=^TestBinChild$", "-test.v")
		cmd.Env = append(os.Environ(), binChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child %d: %v\n%s", i, err, out)
		}
		if !strings.Contains(string(out), "BIN "+dir+"\n") {
			t.Errorf("child %d did not get %s:\n%s", i, dir, out)
		}
		if strings.Contains(string(out), "buildcache: building") {
			t.Errorf("child %d built the binaries again:\n%s", i, out)
		}
	}
	for _, name := range []string{"ipledger", "ipledger-veth", "ipledgerd", "ipledgerctl", "kubectl-ipledger", "portmap"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Size() == 0 {
			t.Errorf("%s in %s: %v", name, dir, err)
		}
	}
}

// binChildEnv makes TestBinChild print Bin's directory.
const binChildEnv = "IPLEDGER_AGENTENV_BIN_CHILD"

// TestBinChild is TestBinSharedAcrossProcesses' child; alone it does nothing.
func TestBinChild(t *testing.T) {
	if os.Getenv(binChildEnv) == "" {
		return
	}
	fmt.Printf("BIN %s\n", Bin(t))
}

// TestSourceKey: the key changes with a command's Go file and with a file it
// embeds, not with a test file; the outputs are the commands.
func TestSourceKey(t *testing.T) {
	root := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/k\n\ngo 1.26\n")
	write("cmd/x/main.go", "package main\n\nimport _ \"embed\"\n\n//go:embed page.html\nvar page string\n\nfunc main() { println(page) }\n")
	write("cmd/x/page.html", "<p>one</p>\n")
	write("cmd/x/x_test.go", "package main\n")
	key := func() []string {
		t.Helper()
		k, outputs, err := sourceKey(root, "./cmd/...")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(outputs, []string{"x"}) {
			t.Fatalf("outputs %v, want [x]", outputs)
		}
		return k
	}
	k0 := key()
	write("cmd/x/x_test.go", "package main\n\n// a test file's change\n")
	if k := key(); !slices.Equal(k, k0) {
		t.Errorf("a test file changed the key:\n%v\n%v", k0, k)
	}
	write("cmd/x/page.html", "<p>two</p>\n")
	k1 := key()
	if slices.Equal(k1, k0) {
		t.Errorf("the embedded file's change left the key as it was: %v", k1)
	}
	write("cmd/x/main.go", "package main\n\nimport _ \"embed\"\n\n//go:embed page.html\nvar page string\n\nfunc main() { print(page) }\n")
	if k := key(); slices.Equal(k, k1) {
		t.Errorf("the Go file's change left the key as it was: %v", k)
	}
}
