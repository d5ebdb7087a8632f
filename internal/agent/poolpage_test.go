package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore/etcdds"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/chromium"
	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// TestPoolPageInChromium starts a real agent with known leases, loads the pool page in
// headless Chromium (one browser for every page the test loads) and checks, from the rendered DOM, the cells of a known pool and
// their states, a cell's holder and history, and a large pool drawn as blocks. The
// screenshot is kept in the test's artifact directory (go test -artifacts -outputdir DIR
// keeps it under DIR; the path is logged).
func TestPoolPageInChromium(t *testing.T) {
	addr := netenv.FreeAddr(t)
	a := agentenv.Start(t, agentenv.Options{Args: []string{"--metrics-addr", addr, "--reuse-delay", "1h"}})
	small, _ := pool.ParseRangeSets([]byte(`[[{"subnet":"10.96.0.0/27"}]]`))
	big, _ := pool.ParseRangeSets([]byte(`[[{"subnet":"10.97.0.0/16"}]]`))
	for _, r := range []api.Request{
		{Op: api.OpAdd, Network: "page", ContainerID: "gone-0", IfName: "eth0", Ranges: small, Pod: api.Pod{Namespace: "shop", Name: "cart-0", UID: "u0"}},
		{Op: api.OpAdd, Network: "page", ContainerID: "sb-web-1", IfName: "eth0", Ranges: small, Pod: api.Pod{Namespace: "shop", Name: "web-1", UID: "u1"}, NetNS: api.NetNS{Path: "/run/netns/web-1"}},
		{Op: api.OpAdd, Network: "page", ContainerID: "sb-web-2", IfName: "eth0", Ranges: small, Pod: api.Pod{Namespace: "shop", Name: "web-2", UID: "u2"}},
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
	b := chromium.Start(t)
	dom := b.DOM(url)
	if !strings.Contains(dom, `<meta http-equiv="refresh"`) {
		t.Error("the page does not refresh itself")
	}
	if regexp.MustCompile(`(src|href)="https?://`).MatchString(dom) {
		t.Error("the page loads an external asset")
	}
	cells := chromium.PoolCells(dom)

	// the small pool, address by address: .1 gateway, .2 cooling (released, reuse
	// delay 1h), .3 and .4 live, .5 … .30 free
	p := cells["page"]
	if len(p) != 30 {
		t.Fatalf("pool page: %d cells, want 30 (10.96.0.1-10.96.0.30)", len(p))
	}
	want := map[string]string{"10.96.0.1": "gateway", "10.96.0.2": "cooling", "10.96.0.3": "live", "10.96.0.4": "live"}
	for _, c := range p {
		w, ok := want[c.IP]
		if !ok {
			w = "free"
		}
		if c.State != w {
			t.Errorf("cell %s is %s, want %s", c.IP, c.State, w)
		}
		switch c.IP {
		case "10.96.0.3":
			for _, s := range []string{"pod shop/web-1", "sandbox sb-web-1", "netns /run/netns/web-1", "since "} {
				if !strings.Contains(c.Title, s) {
					t.Errorf("cell %s: hover text lacks %q: %q", c.IP, s, c.Title)
				}
			}
		case "10.96.0.2":
			if !strings.Contains(c.Title, "recent history:") || !strings.Contains(c.Title, "shop/cart-0 gone-0") || !strings.Contains(c.Title, "(DEL)") {
				t.Errorf("cell %s: hover text lacks its history: %q", c.IP, c.Title)
			}
		}
	}

	// the wide pool (65534 addresses): MaxCells blocks of 64, the first one live
	w := cells["wide"]
	if len(w) != 1024 {
		t.Fatalf("wide pool: %d cells, want 1024 blocks", len(w))
	}
	if w[0].State != "live" || !strings.Contains(w[0].Title, "3 live") || !strings.Contains(w[0].Title, "(64 addresses)") {
		t.Errorf("first block: %+v", w[0])
	}
	for _, c := range w[1:] {
		if c.State != "free" {
			t.Fatalf("block %s is %s, want free", c.IP, c.State)
		}
	}
	// zooming into the first block shows its addresses
	zoom := chromium.PoolCells(b.DOM(url + strings.TrimPrefix(w[0].Href, "/")))["wide"]
	if len(zoom) != 64 || zoom[0].IP != "10.97.0.1" || zoom[0].State != "gateway" || zoom[1].State != "live" || zoom[4].State != "free" {
		t.Errorf("zoomed block: %d cells, first %+v", len(zoom), zoom[:min(5, len(zoom))])
	}

	// clicking a cell shows the address's holder and full history
	detail := b.DOM(url + strings.TrimPrefix(p[1].Href, "/"))
	if !strings.Contains(detail, `id="detail" data-ip="10.96.0.2" data-state="cooling"`) ||
		!regexp.MustCompile(`<td>shop/cart-0</td><td>gone-0</td><td>DEL</td>`).MatchString(detail) {
		t.Errorf("detail of 10.96.0.2 lacks its state or its DEL history:\n%s", detail)
	}

	clusterPage(t, b)

	shot := filepath.Join(t.ArtifactDir(), "pool-page.png")
	b.Screenshot(url, shot)
	t.Logf("screenshot: %s", shot)
}

// clusterPage: a real agent in cluster mode on embedded etcd, a pod holding an
// address, then an IPReservation covering that address and a /28: the page lists
// the reservation with its addresses and reason, draws the /28's addresses
// reserved (naming the reservation), and the covered pod's address live, its
// hover text saying it is inside the reservation until its pod goes. Then the
// operator drains the pool's range: the page shows the drained range and the
// draining block with the pod that still holds it.
func clusterPage(t *testing.T, b *chromium.Browser) {
	e := etcdenv.StartEmbedded(t)
	addr := netenv.FreeAddr(t)
	a := agentenv.Start(t, agentenv.Options{Args: []string{"--metrics-addr", addr, "--node-name", "n0", "--datastore", "etcd",
		"--etcd-endpoints", strings.Join(e.Endpoints(), ","), "--routes=false", "--masquerade=false"}})
	rs, _ := pool.ParseRangeSets([]byte(`[[{"subnet":"10.98.0.0/26"}]]`))
	add := func(cid string) netip.Addr {
		t.Helper()
		for {
			r, err := a.Call(api.Request{Op: api.OpAdd, Network: "cl", ContainerID: cid, IfName: "eth0", Ranges: rs, BlockSize: 26, Pod: api.Pod{Namespace: "lab", Name: cid, UID: "u-" + cid}})
			var ae *api.Error
			if errors.As(err, &ae) && ae.Code == api.CodeUnavailable {
				continue // the agent's copy of the reservations has not listed yet
			}
			if err != nil {
				t.Fatal(err)
			}
			return netip.MustParsePrefix(r.Lease.IPs[0]).Addr()
		}
	}
	held := add("router-0")
	ds, err := etcdds.New(etcdds.Config{Endpoints: e.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	v, _ := cluster.MarshalReservation(cluster.Reservation{Name: "lab", Reason: "lab routers", Prefixes: []netip.Prefix{netip.PrefixFrom(held, 32), netip.MustParsePrefix("10.98.0.32/28")}})
	if _, err := ds.Create(context.Background(), cluster.ReservationKey("lab"), v); err != nil {
		t.Fatal(err)
	}
	url := "http://" + addr + "/"
	var dom string
	for i := 0; ; i++ {
		dom = b.DOM(url)
		if strings.Contains(dom, `<tr class="reservation" data-name="lab">`) {
			break
		}
		if i == 60 {
			t.Fatalf("the page never listed IPReservation lab:\n%s", dom)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if want := fmt.Sprintf("<td>lab</td><td>%s/32, 10.98.0.32/28</td><td>lab routers</td>", held); !strings.Contains(dom, want) {
		t.Errorf("the reserved section lacks %q:\n%s", want, dom)
	}
	for _, c := range chromium.PoolCells(dom)["cl"] {
		ip := netip.MustParseAddr(c.IP)
		switch {
		case ip == held:
			if c.State != "live" || !strings.Contains(c.Title, "inside IPReservation lab (lab routers): kept until its pod goes") {
				t.Errorf("the covered pod's cell %+v, want live, inside lab", c)
			}
		case netip.MustParsePrefix("10.98.0.32/28").Contains(ip):
			if c.State != "reserved" || !strings.Contains(c.Title, "reserved by IPReservation lab (lab routers)") {
				t.Errorf("cell %+v, want reserved by lab", c)
			}
		case c.State == "reserved":
			t.Errorf("cell %+v is reserved, outside IPReservation lab", c)
		}
	}

	// the operator drains 10.98.0.0/26 (the record's range moved to drained, a new
	// range in its place): the page shows the drained range and the block, held
	// by router-0
	kv, err := ds.Get(context.Background(), cluster.PoolKey("cl"))
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		t.Fatal(err)
	}
	rec["drained"] = rec["ranges"].([]any)[0]
	rec["ranges"] = []any{[]any{map[string]any{"subnet": "10.99.0.0/26"}}}
	nv, _ := json.Marshal(rec)
	if _, err := ds.Update(context.Background(), kv.Key, nv, kv.Revision); err != nil {
		t.Fatal(err)
	}
	// the agent follows the record through its watch: wait for its audit to
	// show the block draining, then load the page once
	for i := 0; ; i++ {
		r, err := a.Call(api.Request{Op: api.OpAudit})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Audit.Pools) == 1 && len(r.Audit.Pools[0].Draining) == 1 {
			break
		}
		if i == 60 {
			t.Fatalf("the agent never drained the block: %+v", r.Audit.Pools)
		}
		time.Sleep(500 * time.Millisecond)
	}
	dom = b.DOM(url)
	for _, want := range []string{`<div class="drained" data-ranges="10.98.0.0/26">drained (no new address from them): 10.98.0.0/26</div>`,
		`<div class="draining" data-block="10.98.0.0/26" data-leases="1">block 10.98.0.0/26 draining, held by 1 leases: lab/router-0</div>`} {
		if !strings.Contains(dom, want) {
			t.Errorf("the drained pool's section lacks %q:\n%s", want, dom)
		}
	}
	if _, err := a.Call(api.Request{Op: api.OpDel, Network: "cl", ContainerID: "router-0", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
}
