package testenv_test

import (
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
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
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^KUBELET_PKGS\s*:?=((?:.*\\\n)*.*)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("the Makefile has no KUBELET_PKGS: make test cannot tell the kubelet lane from the other")
	}
	var lane []string
	for _, f := range strings.Fields(strings.ReplaceAll(string(m[1]), "\\\n", " ")) {
		lane = append(lane, strings.TrimPrefix(f, "./"))
	}
	slices.Sort(lane)

	tm := regexp.MustCompile(`(?m)^KUBELET_TAGS\s*:?=\s*(\S+)\s*$`).FindSubmatch(mk)
	if tm == nil {
		t.Fatal("the Makefile has no KUBELET_TAGS: make test cannot build the kubelet lane's cluster tests")
	}
	tag := string(tm[1])
	var starters, untagged []string
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
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
