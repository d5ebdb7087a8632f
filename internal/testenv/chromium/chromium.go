// Package chromium runs Debian's chromium headless for tests of pages: it installs
// the package when missing (through debpkg, under the lock every installer takes),
// loads pages in one running browser, returning their rendered DOM and screenshots.
package chromium

import (
	"os/exec"
	"testing"

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

// DumpDOM loads url in a chromium of its own and returns the DOM as rendered. A
// test that loads several pages starts one Browser instead.
func DumpDOM(tb testing.TB, url string) string {
	tb.Helper()
	b := Start(tb)
	defer b.Close()
	return b.DOM(url)
}

// Screenshot loads url in a chromium of its own and saves a PNG of it at path.
func Screenshot(tb testing.TB, url, path string) {
	tb.Helper()
	b := Start(tb)
	defer b.Close()
	b.Screenshot(url, path)
}
