// Package chromium runs Debian's chromium headless for tests of pages: it installs
// the package when missing (through debpkg, under the lock every installer takes),
// dumps a page's rendered DOM and takes screenshots.
package chromium

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/debpkg"
)

// Path returns the chromium binary, installing Debian's package if it is missing
// (under -short, skipping tb instead: see debpkg.Need).
func Path(tb testing.TB) string {
	tb.Helper()
	debpkg.Need(tb, debpkg.Chromium)
	p, err := exec.LookPath("chromium")
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// run runs chromium headless with args and url and returns its stdout.
func run(tb testing.TB, url string, args ...string) string {
	tb.Helper()
	bin := Path(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--user-data-dir=" + tb.TempDir(), "--window-size=1400,1000", "--hide-scrollbars"}
	cmd := exec.CommandContext(ctx, bin, append(append(base, args...), url)...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		tb.Fatalf("chromium %v %s: %v\n%s", args, url, err, errOut.String())
	}
	return out.String()
}

// DumpDOM loads url and returns the DOM as rendered.
func DumpDOM(tb testing.TB, url string) string {
	tb.Helper()
	return run(tb, url, "--dump-dom")
}

// Screenshot loads url and saves a PNG of it at path.
func Screenshot(tb testing.TB, url, path string) {
	tb.Helper()
	run(tb, url, "--screenshot="+path)
	if fi, err := os.Stat(path); err != nil || fi.Size() < 1000 {
		tb.Fatalf("screenshot %s: %v", path, err)
	}
}
