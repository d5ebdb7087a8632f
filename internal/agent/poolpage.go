package agent

import (
	_ "embed"
	"fmt"
	"html/template"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
)

// MaxCells bounds the cells drawn for one range set. A set of at most MaxCells
// addresses is drawn one cell per address; a larger one as MaxCells blocks of equal
// size, each coloured by the most severe state among its addresses (leaked, stranded,
// suspect, live, cooling, free) with its counts on hover; clicking a block zooms into
// it (recursively, so even an IPv6 /64 can be walked down to its addresses).
const MaxCells = 1024

// Cell states, most severe first.
var cellStates = []string{"leaked", "stranded", "suspect", "live", "cooling", "free", "reserved", "gateway"}

func severity(state string) int {
	for i, s := range cellStates {
		if s == state {
			return i
		}
	}
	return len(cellStates)
}

//go:embed poolpage.html
var poolPageHTML string

var poolTmpl = template.Must(template.New("pool").Funcs(template.FuncMap{"podInAPI": podInAPI, "join": strings.Join}).Parse(poolPageHTML))

type pageData struct {
	Now        string
	Refresh    int
	ReuseDelay time.Duration
	States     []string
	Networks   []netView
	Detail     *cellDetail
	Error      string
	// Reserved: cluster mode's IPReservations (ReservedErr: why they are unknown)
	Reserved    []reservedView
	ReservedErr string
	Cluster     bool
}

type reservedView struct {
	Name, Addresses, Reason string
}

type netView struct {
	Name   string
	Counts []stateCount
	Sets   []setView
	// Drained and Draining: cluster mode's ranges that drain on this node and
	// its draining blocks with their holders (drainingOf)
	Drained  []string
	Draining []api.DrainingBlock
}

type stateCount struct {
	State string
	N     uint64
}

type setView struct {
	Index     int
	Ranges    string
	Window    string // the addresses drawn, when zoomed in
	BlockSize uint64 // 1: one cell per address
	Cells     []cellView
	ZoomOut   string
}

type cellView struct {
	State string
	Label string // the address, or the block's first address
	Title string
	Href  string
}

type cellDetail struct {
	Network string
	IP      string
	State   string
	Lease   *api.LeaseView
	History []ledger.Release
}

// addrInfo is what the page knows of one address.
type addrInfo struct {
	state string
	lease *api.LeaseView
	free  *ledger.Free
}

// netState is one network's addresses that are not simply free.
type netState struct {
	byIP map[netip.Addr]addrInfo
}

func (s *Server) netState(network string, now time.Time) netState {
	ns := netState{byIP: map[netip.Addr]addrInfo{}}
	delay := s.cfg.Ledger.ReuseDelay()
	for _, f := range s.cfg.Ledger.FreeAddresses(network) {
		st := "free"
		if now.Before(f.ReleasedAt.Add(delay)) {
			st = "cooling"
		}
		fc := f
		ns.byIP[f.IP] = addrInfo{state: st, free: &fc}
	}
	for _, ls := range s.cfg.Ledger.Leases(network) {
		v := s.view(ls)
		st := "live"
		switch {
		case v.Verdict != "":
			st = v.Verdict
		case v.Suspect != "":
			st = "suspect"
		}
		for _, p := range ls.IPs {
			ns.byIP[p.Addr()] = addrInfo{state: st, lease: &v}
		}
	}
	return ns
}

func (s *Server) poolPage(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	q := r.URL.Query()
	d := pageData{Now: now.Format(time.RFC3339), Refresh: 10, ReuseDelay: s.cfg.Ledger.ReuseDelay(), States: cellStates[:len(cellStates)-2]}
	var reserved []cluster.Reservation
	if s.cfg.Reservations != nil {
		d.Cluster = true
		var err error
		if reserved, err = s.cfg.Reservations.Current(); err != nil {
			d.ReservedErr = err.Error()
		}
		for _, r := range reserved {
			var as []string
			for _, p := range r.Prefixes {
				as = append(as, p.String())
			}
			d.Reserved = append(d.Reserved, reservedView{Name: r.Name, Addresses: strings.Join(as, ", "), Reason: r.Reason})
		}
	}
	onlyNet, onlySet := q.Get("network"), -1
	var from, span uint64
	if v := q.Get("set"); v != "" {
		onlySet, _ = strconv.Atoi(v)
		from, _ = strconv.ParseUint(q.Get("from"), 10, 64)
		span, _ = strconv.ParseUint(q.Get("span"), 10, 64)
	}
	for _, p := range s.cfg.Ledger.Pools() {
		if onlyNet != "" && p.Network != onlyNet {
			continue
		}
		ns := s.netState(p.Network, now)
		nv := netView{Name: p.Network}
		if s.cfg.Cluster != nil {
			nv.Drained, nv.Draining = s.drainingOf(p.Network)
		}
		counts := map[string]uint64{}
		for _, ai := range ns.byIP {
			counts[ai.state]++
		}
		var usable uint64
		for _, u := range p.Usable {
			usable += u
		}
		var notFree uint64
		for st, n := range counts {
			if st != "free" {
				notFree += n
			}
		}
		counts["free"] = usable - min(notFree, usable)
		for _, st := range d.States {
			nv.Counts = append(nv.Counts, stateCount{st, counts[st]})
		}
		for i, set := range p.Ranges {
			if onlySet >= 0 && i != onlySet {
				continue
			}
			size := set.Size()
			f, sp := uint64(0), size
			if onlySet >= 0 && span > 0 && from < size {
				f, sp = from, min(span, size-from)
			}
			sv := s.drawSet(p.Network, i, set, ns, f, sp, reserved)
			if onlySet >= 0 {
				sv.ZoomOut = "?" + url.Values{"network": {p.Network}}.Encode()
			}
			nv.Sets = append(nv.Sets, sv)
		}
		d.Networks = append(d.Networks, nv)
		if ip := q.Get("ip"); ip != "" && (onlyNet == "" || onlyNet == p.Network) {
			if a, err := netip.ParseAddr(ip); err == nil && inPool(p.Ranges, a) {
				cd := &cellDetail{Network: p.Network, IP: a.String(), State: "free"}
				if ai, ok := ns.byIP[a]; ok {
					cd.State, cd.Lease = ai.state, ai.lease
				}
				cd.History, _ = s.cfg.Ledger.History(p.Network, a)
				d.Detail = cd
			}
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := poolTmpl.Execute(w, d); err != nil {
		s.log.Error("pool page", "err", err)
	}
}

func inPool(sets []pool.RangeSet, a netip.Addr) bool {
	for _, s := range sets {
		if s.Contains(a) {
			return true
		}
	}
	return false
}

// drawSet draws the addresses [from, from+span) of a range set.
func (s *Server) drawSet(network string, idx int, set pool.RangeSet, ns netState, from, span uint64, reserved []cluster.Reservation) setView {
	sv := setView{Index: idx, Ranges: set.String(), BlockSize: 1}
	if span == 0 {
		return sv
	}
	if from > 0 || span < set.Size() {
		first, _ := set.Addr(from)
		last, _ := set.Addr(from + span - 1)
		sv.Window = first.String() + " – " + last.String()
	}
	if span <= MaxCells {
		for off := from; off < from+span; off++ {
			a, ok := set.Addr(off)
			if !ok {
				break
			}
			c := cellView{State: "free", Label: a.String(), Href: "?" + url.Values{"network": {network}, "ip": {a.String()}}.Encode() + "#detail"}
			ai, known := ns.byIP[a]
			switch {
			case set.Reserved(a):
				c.State = "gateway"
				c.Title = a.String() + ": gateway, never handed out"
			case known:
				c.State = ai.state
				c.Title = s.cellTitle(network, a, ai)
			default:
				c.Title = a.String() + ": free, never used"
			}
			if r, in := cluster.Covering(reserved, a); in {
				note := "IPReservation " + r.Name
				if r.Reason != "" {
					note += " (" + r.Reason + ")"
				}
				if c.State == "free" || c.State == "cooling" {
					c.State, c.Title = "reserved", a.String()+": reserved by "+note+", handed out to no pod"
				} else {
					c.Title += "\ninside " + note + ": kept until its pod goes"
				}
			}
			sv.Cells = append(sv.Cells, c)
		}
		return sv
	}
	ceil := func(a, b uint64) uint64 { // without overflow: span may be 2^64-1 (an IPv6 /64)
		q := a / b
		if a%b != 0 {
			q++
		}
		return q
	}
	bs := ceil(span, MaxCells)
	sv.BlockSize = bs
	n := ceil(span, bs)
	type block struct{ counts map[string]uint64 }
	blocks := make([]block, n)
	for a, ai := range ns.byIP {
		off, ok := set.Offset(a)
		if !ok || off < from || off >= from+span {
			continue
		}
		b := &blocks[(off-from)/bs]
		if b.counts == nil {
			b.counts = map[string]uint64{}
		}
		b.counts[ai.state]++
	}
	for i := range blocks {
		start := from + uint64(i)*bs
		size := min(bs, from+span-start)
		first, _ := set.Addr(start)
		last, _ := set.Addr(start + size - 1)
		var taken uint64
		state := "free"
		var parts []string
		for _, st := range cellStates {
			if c := blocks[i].counts[st]; c > 0 {
				taken += c
				parts = append(parts, fmt.Sprintf("%d %s", c, st))
				if severity(st) < severity(state) {
					state = st
				}
			}
		}
		if size > taken {
			parts = append(parts, fmt.Sprintf("%d free or never used", size-taken))
		}
		sv.Cells = append(sv.Cells, cellView{State: state, Label: first.String(),
			Title: fmt.Sprintf("%s – %s (%d addresses): %s; click to zoom in", first, last, size, strings.Join(parts, ", ")),
			Href:  "?" + url.Values{"network": {network}, "set": {strconv.Itoa(idx)}, "from": {strconv.FormatUint(start, 10)}, "span": {strconv.FormatUint(size, 10)}}.Encode()})
	}
	return sv
}

// cellTitle is an address's hover text: its state, holder and recent history.
func (s *Server) cellTitle(network string, a netip.Addr, ai addrInfo) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", a, ai.state)
	if v := ai.lease; v != nil {
		pod := "pod unknown"
		if v.Name != "" {
			pod = "pod " + v.Namespace + "/" + v.Name
		}
		fmt.Fprintf(&b, "\n%s\nsandbox %s (%s)\nnetns %s\nsince %s", pod, v.ContainerID, orDash(v.Sandbox), orDash(v.NetNS), v.Created.Format(time.RFC3339))
		if a := podInAPI(*v); a != "" {
			fmt.Fprintf(&b, "\n%s", a)
		}
		if v.Suspect != "" {
			fmt.Fprintf(&b, "\nsuspect: %s", v.Suspect)
		}
	} else if f := ai.free; f != nil {
		fmt.Fprintf(&b, " since %s", f.ReleasedAt.Format(time.RFC3339))
	}
	h, _ := s.cfg.Ledger.History(network, a)
	if len(h) > 0 {
		b.WriteString("\nrecent history:")
		for i := len(h) - 1; i >= 0 && i >= len(h)-3; i-- {
			r := h[i]
			fmt.Fprintf(&b, "\n  %s %s until %s (%s)", holderName(r), r.Key.ContainerID, r.To.Format(time.RFC3339), r.Reason)
		}
	}
	return b.String()
}

func holderName(r ledger.Release) string {
	if r.Pod.Name != "" {
		return r.Pod.Namespace + "/" + r.Pod.Name
	}
	return "-"
}

// podInAPI is what the Kubernetes API says of a lease's pod, for the page: "pod
// Running in the API", "pod deleted from the API", or "" when the agent cannot tell.
func podInAPI(v api.LeaseView) string {
	switch {
	case v.PodInAPI == api.PodInAPINo:
		return "pod deleted from the API"
	case v.PodInAPI == api.PodInAPIYes && v.PodPhase != "":
		return "pod " + v.PodPhase + " in the API"
	case v.PodInAPI == api.PodInAPIYes:
		return "pod in the API, no phase yet"
	}
	return ""
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
