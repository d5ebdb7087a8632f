package testenv_test

import (
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// clusterStarters are the calls that start a kubelet cluster and so take the
// host-wide cluster lock: kubeenv's own, and the environments built on them.
var clusterStarters = map[string][]string{
	"kubeenv":  {"Start", "StartControlPlane"},
	"nodesenv": {"Start", "StartNodes", "StartNodesMaxPods", "Upstream"},
	"onenode":  {"Start", "Run"},
}

// TestKubeletLaneIsComplete: make test's kubelet lane (the Makefile's
// KUBELET_PKGS) is exactly the packages whose tests start a kubelet cluster.
// A cluster package missing from it would run in the other lane beside the
// lock chain, and wait there for the lock while that lane's packages queue
// behind it; a package in it that starts no cluster lengthens the chain.
// And every test file that starts one builds only with the Makefile's
// KUBELET_TAGS, so that a plain `go test ./...` (ten minutes a package, two
// at a time) leaves out what cannot fit in it.
func TestKubeletLaneIsComplete(t *testing.T) {
	root := filepath.Join("..", "..")
	lane, tag := makefileLanes(t, root)
	var starters, untagged []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_") || n == "testdata" || n == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution|parser.ParseComments)
		if err != nil {
			return err
		}
		tagged := kubeletOnly(f, tag)
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && slices.Contains(clusterStarters[x.Name], sel.Sel.Name) {
				rel, _ := filepath.Rel(root, filepath.Dir(path))
				if !tagged && !slices.Contains(untagged, path) {
					untagged = append(untagged, path)
					t.Errorf("%s starts a kubelet cluster but builds without the tag %q: begin it with //go:build %s", path, tag, tag)
				}
				if !slices.Contains(starters, rel) {
					starters = append(starters, rel)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(starters)
	if len(starters) == 0 {
		t.Fatal("no package's tests start a kubelet cluster: the search is broken")
	}
	for _, p := range starters {
		if !slices.Contains(lane, p) {
			t.Errorf("%s starts a kubelet cluster but is not in the Makefile's KUBELET_PKGS: add ./%s there", p, p)
		}
	}
	for _, p := range lane {
		if !slices.Contains(starters, p) {
			t.Errorf("the Makefile's KUBELET_PKGS holds %s, whose tests start no kubelet cluster: move it out of the kubelet lane", p)
		}
	}
}

// makefileLanes reads the Makefile's KUBELET_PKGS (sorted, without "./") and
// KUBELET_TAGS.
func makefileLanes(t *testing.T, root string) (lane []string, tag string) {
	t.Helper()
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^KUBELET_PKGS\s*:?=((?:.*\\\n)*.*)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("the Makefile has no KUBELET_PKGS: make test cannot tell the kubelet lane from the other")
	}
	for _, f := range strings.Fields(strings.ReplaceAll(string(m[1]), "\\\n", " ")) {
		lane = append(lane, strings.TrimPrefix(f, "./"))
	}
	slices.Sort(lane)
	tm := regexp.MustCompile(`(?m)^KUBELET_TAGS\s*:?=\s*(\S+)\s*$`).FindSubmatch(mk)
	if tm == nil {
		t.Fatal("the Makefile has no KUBELET_TAGS: make test cannot build the kubelet lane's cluster tests")
	}
	return lane, string(tm[1])
}

// TestLanesSplitTheModule: scripts/test-lanes.sh, given the Makefile's
// KUBELET_PKGS and KUBELET_TAGS, puts exactly those packages in the kubelet
// lane and every other package of the module in the other, each once. The
// script lists them with go list; a package whose files all carry the tag is
// refused by a go list without it, and make test then fails before any test
// runs.
func TestLanesSplitTheModule(t *testing.T) {
	root := filepath.Join("..", "..")
	lane, tag := makefileLanes(t, root)
	goBin := "go" // as agentenv runs it: the go command on PATH, which runs the tests
	var pkgs []string
	for _, p := range lane {
		pkgs = append(pkgs, "./"+p)
	}
	cmd := exec.Command("scripts/test-lanes.sh", "--list")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GO="+goBin, "KUBELET_PKGS="+strings.Join(pkgs, " "), "KUBELET_TAGS="+tag)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/test-lanes.sh --list: %v\n%s", err, out)
	}
	mod, err := exec.Command(goBin, "list", "-m").Output()
	if err != nil {
		t.Fatal(err)
	}
	prefix := strings.TrimSpace(string(mod)) + "/"
	all, err := exec.Command(goBin, "list", "-tags", tag, "./...").Output()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		name, pkg, ok := strings.Cut(line, " ")
		if !ok || (name != "kubelet" && name != "other") {
			t.Fatalf("scripts/test-lanes.sh --list printed %q, want \"kubelet|other PACKAGE\"", line)
		}
		if prev, dup := seen[pkg]; dup {
			t.Errorf("%s is in the %s lane and the %s lane", pkg, prev, name)
		}
		seen[pkg] = name
		if want := slices.Contains(lane, strings.TrimPrefix(pkg, prefix)); want != (name == "kubelet") {
			t.Errorf("%s is in the %s lane; the Makefile's KUBELET_PKGS says otherwise", pkg, name)
		}
	}
	for _, pkg := range strings.Fields(string(all)) {
		if seen[pkg] == "" {
			t.Errorf("%s is in no lane: make test would not run it", pkg)
		}
	}
}

// kubeletOnly reports whether f's build constraint leaves it out of a build
// without tag, whatever other tags are set (conformance, the platform's).
func kubeletOnly(f *ast.File, tag string) bool {
	for _, cg := range f.Comments {
		if cg.Pos() >= f.Package {
			break
		}
		for _, c := range cg.List {
			if !constraint.IsGoBuild(c.Text) {
				continue
			}
			x, err := constraint.Parse(c.Text)
			if err != nil {
				return false
			}
			return !x.Eval(func(t string) bool { return t != tag })
		}
	}
	return false
}
