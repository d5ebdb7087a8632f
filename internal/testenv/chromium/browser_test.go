package chromium_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/testenv/chromium"
)

// TestBrowserLoadsPageAfterPage: one chromium loads three pages in turn and returns
// each one's DOM as rendered (a script's change included: the served text is not
// what it returns), and a screenshot is a PNG of the page.
func TestBrowserLoadsPageAfterPage(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		switch r.URL.Path {
		case "/script":
			fmt.Fprint(w, `<html><body><p id="p">served</p><script>document.getElementById("p").textContent = "rendered"</script></body></html>`)
		default:
			fmt.Fprintf(w, `<html><body><p>page %s</p></body></html>`, r.URL.Path)
		}
	}))
	defer srv.Close()

	b := chromium.Start(t)
	for _, page := range []string{"/one", "/two"} {
		if dom := b.DOM(srv.URL + page); !strings.Contains(dom, "<p>page "+page+"</p>") {
			t.Errorf("DOM of %s:\n%s", page, dom)
		}
	}
	if dom := b.DOM(srv.URL + "/script"); !strings.Contains(dom, `<p id="p">rendered</p>`) {
		t.Errorf("DOM of /script lacks the script's change:\n%s", dom)
	}
	shot := filepath.Join(t.TempDir(), "one.png")
	b.Screenshot(srv.URL+"/one", shot)
	png, err := os.ReadFile(shot)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("screenshot: %d bytes, %v", len(png), err)
	}
}
