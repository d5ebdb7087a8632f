package agent_test

import (
	"context"
	"fmt"
	"html"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
)

// ensureChromium installs Debian's chromium when it is missing, under a lock so
// parallel test processes do not run apt at once.
func ensureChromium(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	lock, err := os.OpenFile("/tmp/ipledger-apt.lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	t.Log("installing chromium (apt-get)")
	for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", "chromium"}} {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("apt-get %v: %v\n%s", args, err, out)
		}
	}
	p, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// headless runs chromium headless with args and url and returns its stdout.
func headless(t *testing.T, chromium, url string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	profile := t.TempDir()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--user-data-dir=" + profile, "--window-size=1400,1000"}
	cmd := exec.CommandContext(ctx, chromium, append(append(base, args...), url)...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v %s: %v\n%s", args, url, err, errOut.String())
	}
	return out.String()
}

var (
	cellTag = regexp.MustCompile(`<a [^>]*class="cell [^"]*"[^>]*>`)
	attrRe  = regexp.MustCompile(`([a-z-]+)="([^"]*)"`)
	section = regexp.MustCompile(`(?s)<section class="network" data-network="([^"]+)">(.*?)</section>`)
)

type domCell struct{ ip, state, title, href string }

// cellsByNetwork reads the pool grid from a DOM dump.
func cellsByNetwork(dom string) map[string][]domCell {
	out := map[string][]domCell{}
	for _, s := range section.FindAllStringSubmatch(dom, -1) {
		for _, tag := range cellTag.FindAllString(s[2], -1) {
			a := map[string]string{}
			for _, m := range attrRe.FindAllStringSubmatch(tag, -1) {
				a[m[1]] = html.UnescapeString(m[2])
			}
			out[s[1]] = append(out[s[1]], domCell{a["data-ip"], a["data-state"], a["title"], a["href"]})
		}
	}
	return out
}

// TestPoolPageInChromium starts a real agent with known leases, loads the pool page in
// headless Chromium and checks, from the rendered DOM, the cells of a known pool and
// their states, a cell's holder and history, and a large pool drawn as blocks. The
// screenshot is kept in the test's artifact directory (go test -artifacts -outputdir DIR
// keeps it under DIR; the path is logged).
func TestPoolPageInChromium(t *testing.T) {
	chromium := ensureChromium(t)
	addr := freeAddr(t)
	a := agentenv.Start(t, agentenv.Options{Args: []string{"--metrics-addr", addr, "--reuse-delay", "1h"}})
	small, _ := pool.ParseRangeSets([]byte(`[[{"subnet":"10.96.0.0/27"}]]`))
	big, _ := pool.ParseRangeSets([]byte(`[[{"subnet":"10.97.0.0/16"}]]`))
	for _, r := range []api.Request{
		{Op: api.OpAdd, Network: "page", ContainerID: "gone-0", IfName: "eth0", Ranges: small, Pod: ledger.Pod{Namespace: "shop", Name: "cart-0", UID: "u0"}},
		{Op: api.OpAdd, Network: "page", ContainerID: "sb-web-1", IfName: "eth0", Ranges: small, Pod: ledger.Pod{Namespace: "shop", Name: "web-1", UID: "u1"}, NetNS: ledger.NetNS{Path: "/run/netns/web-1"}},
		{Op: api.OpAdd, Network: "page", ContainerID: "sb-web-2", IfName: "eth0", Ranges: small, Pod: ledger.Pod{Namespace: "shop", Name: "web-2", UID: "u2"}},
		{Op: api.OpDel, Network: "page", ContainerID: "gone-0", IfName: "eth0"},
	} {
		if _, err := a.Call(r); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		if _, err := a.Call(api.Request{Op: api.OpAdd, Network: "wide", ContainerID: fmt.Sprint("w", i), IfName: "eth0", Ranges: big}); err != nil {
			t.Fatal(err)
		}
	}
	url := "http://" + addr + "/"
	dom := headless(t, chromium, url, "--dump-dom")
	if !strings.Contains(dom, `<meta http-equiv="refresh"`) {
		t.Error("the page does not refresh itself")
	}
	if regexp.MustCompile(`(src|href)="https?://`).MatchString(dom) {
		t.Error("the page loads an external asset")
	}
	cells := cellsByNetwork(dom)

	// the small pool, address by address: .1 gateway, .2 cooling (released, reuse
	// delay 1h), .3 and .4 live, .5 … .30 free
	p := cells["page"]
	if len(p) != 30 {
		t.Fatalf("pool page: %d cells, want 30 (10.96.0.1-10.96.0.30)", len(p))
	}
	want := map[string]string{"10.96.0.1": "gateway", "10.96.0.2": "cooling", "10.96.0.3": "live", "10.96.0.4": "live"}
	for _, c := range p {
		w, ok := want[c.ip]
		if !ok {
			w = "free"
		}
		if c.state != w {
			t.Errorf("cell %s is %s, want %s", c.ip, c.state, w)
		}
		switch c.ip {
		case "10.96.0.3":
			for _, s := range []string{"pod shop/web-1", "sandbox sb-web-1", "netns /run/netns/web-1", "since "} {
				if !strings.Contains(c.title, s) {
					t.Errorf("cell %s: hover text lacks %q: %q", c.ip, s, c.title)
				}
			}
		case "10.96.0.2":
			if !strings.Contains(c.title, "recent history:") || !strings.Contains(c.title, "shop/cart-0 gone-0") || !strings.Contains(c.title, "(DEL)") {
				t.Errorf("cell %s: hover text lacks its history: %q", c.ip, c.title)
			}
		}
	}

	// the wide pool (65534 addresses): MaxCells blocks of 64, the first one live
	w := cells["wide"]
	if len(w) != 1024 {
		t.Fatalf("wide pool: %d cells, want 1024 blocks", len(w))
	}
	if w[0].state != "live" || !strings.Contains(w[0].title, "3 live") || !strings.Contains(w[0].title, "(64 addresses)") {
		t.Errorf("first block: %+v", w[0])
	}
	for _, c := range w[1:] {
		if c.state != "free" {
			t.Fatalf("block %s is %s, want free", c.ip, c.state)
		}
	}
	// zooming into the first block shows its addresses
	zoom := cellsByNetwork(headless(t, chromium, url+strings.TrimPrefix(w[0].href, "/"), "--dump-dom"))["wide"]
	if len(zoom) != 64 || zoom[0].ip != "10.97.0.1" || zoom[0].state != "gateway" || zoom[1].state != "live" || zoom[4].state != "free" {
		t.Errorf("zoomed block: %d cells, first %+v", len(zoom), zoom[:min(5, len(zoom))])
	}

	// clicking a cell shows the address's holder and full history
	detail := headless(t, chromium, url+strings.TrimPrefix(p[1].href, "/"), "--dump-dom")
	if !strings.Contains(detail, `id="detail" data-ip="10.96.0.2" data-state="cooling"`) ||
		!regexp.MustCompile(`<td>shop/cart-0</td><td>gone-0</td><td>DEL</td>`).MatchString(detail) {
		t.Errorf("detail of 10.96.0.2 lacks its state or its DEL history:\n%s", detail)
	}

	shot := filepath.Join(t.ArtifactDir(), "pool-page.png")
	headless(t, chromium, url, "--screenshot="+shot, "--hide-scrollbars")
	if fi, err := os.Stat(shot); err != nil || fi.Size() < 1000 {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	t.Logf("screenshot: %s", shot)
}
