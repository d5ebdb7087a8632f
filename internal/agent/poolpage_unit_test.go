package agent_test

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/testenv/chromium"
)

// TestPoolPageHugePool: an IPv6 /64 (2^64 addresses) is drawn as MaxCells blocks,
// the leased one's block coloured live, and a block can be zoomed into down to its
// addresses. (The page is served in process here; TestPoolPageInChromium renders it in
// a browser.)
func TestPoolPageHugePool(t *testing.T) {
	s, _, _ := newServer(t, nil)
	h := s.HTTPHandler()
	r := addReq(t, "v6")
	r.Network, r.Ranges = "v6", ledgertest.Ranges(t, `[[{"subnet":"fd00:64::/64"}]]`)
	if resp := s.Handle(t.Context(), r); resp.Error != nil {
		t.Fatal(resp.Error)
	}
	page := func(path string) map[string][]chromium.Cell {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		b, _ := io.ReadAll(rec.Body)
		if rec.Code != 200 {
			t.Fatalf("%s: %d %s", path, rec.Code, b)
		}
		return chromium.PoolCells(string(b))
	}
	path := "/"
	for depth := 0; ; depth++ {
		cells := page(path)["v6"]
		if len(cells) == 0 || len(cells) > 1024 {
			t.Fatalf("%s: %d cells", path, len(cells))
		}
		if cells[0].State != "live" && cells[1].State != "live" {
			t.Fatalf("%s: the leased address's cell is not live: %+v %+v", path, cells[0], cells[1])
		}
		if !strings.Contains(cells[0].Href, "span=") { // addresses, not blocks
			if cells[0].IP != "fd00:64::1" || cells[0].State != "gateway" || cells[1].IP != "fd00:64::2" || cells[1].State != "live" {
				t.Fatalf("%s: first cells %+v %+v", path, cells[0], cells[1])
			}
			// blocks of 2^54, 2^44, 2^34, 2^24, 2^14, 16 addresses, then addresses
			if depth != 6 {
				t.Fatalf("reached the addresses after %d zooms, want 6", depth)
			}
			return
		}
		if depth > 10 {
			t.Fatal("zooming never reaches the addresses")
		}
		path = "/" + cells[0].Href
	}
}
