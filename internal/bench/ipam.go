package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/pool"
)

// fills are the pool fills (percent of a /22's usable addresses) of the latency rows.
var fills = []int{0, 50, 95}

// usable is the number of addresses of a /bits IPv4 pool both plugins hand out:
// network, broadcast and the default gateway (.1) never are.
func usable(bits int) int { return 1<<(32-bits) - 3 }

// sized gives a /22 base subnet the pool's prefix length.
func (h *harness) sized(subnet string) string {
	return strings.TrimSuffix(subnet, "/22") + fmt.Sprintf("/%d", h.opts.PoolBits)
}

// Unique test pools (never routed off the machine).
const (
	subnetIPAMIPL   = "10.247.0.0/22"
	subnetIPAMHL    = "10.247.4.0/22"
	subnetVethIPL   = "10.247.8.0/22"
	subnetVethPTP   = "10.247.12.0/22"
	subnetBurstIPL  = "10.247.16.0/22"
	subnetBurstHL   = "10.247.20.0/22"
	subnetLedger    = "10.249.0.0/16"
	subnetAgentRSS  = "10.246.0.0/16"
	ipamNetIPL      = "bench-ipam-ipl"
	ipamNetHL       = "bench-ipam-hl"
	burstNetIPL     = "bench-burst-ipl"
	burstNetHL      = "bench-burst-hl"
	vethNetIPL      = "bench-veth"
	vethNetPTP      = "bench-ptp"
	rssNet          = "bench-rss"
	ledgerNet       = "bench-ledger"
	cniVersion      = "1.0.0"
	reuseDelayParam = "0s"
)

func rangesJSON(subnet string) string { return fmt.Sprintf(`[[{"subnet":%q}]]`, subnet) }

// ipamSys is one IPAM plugin under test.
type ipamSys struct {
	name, plugin string
	conf         []byte
	// fill brings the pool to n live leases (ids fill-*) without timing.
	fill func(n int) error
	// live counts the pool's live leases.
	live func() (int, error)
}

func (h *harness) ipledgerIPAM(network, subnet string) *ipamSys {
	conf := []byte(fmt.Sprintf(`{"cniVersion":%q,"name":%q,"type":"bench","ipam":%s}`, cniVersion, network, h.agent.IPAM(rangesJSON(subnet))))
	sets, _ := pool.ParseRangeSets([]byte(rangesJSON(subnet)))
	filled := 0
	return &ipamSys{name: "ipledger", plugin: "ipledger", conf: conf,
		fill: func(n int) error {
			from := filled
			filled = max(filled, n)
			return parallel(n-from, 16, func(i int) error {
				return h.apiAdd(h.agent.Socket, network, fmt.Sprintf("fill-%05d", from+i), sets)
			})
		},
		live: func() (int, error) {
			ctx, cancel := context.WithTimeout(h.ctx, 30*time.Second)
			defer cancel()
			resp, err := api.Call(ctx, h.agent.Socket, api.Request{Op: api.OpStatus, Network: network})
			if err != nil {
				return 0, err
			}
			if resp.Pool == nil {
				return 0, nil
			}
			return resp.Pool.InUse, nil
		}}
}

// apiAdd allocates through the agent's socket API (for filling pools).
func (h *harness) apiAdd(socket, network, id string, sets []pool.RangeSet) error {
	ctx, cancel := context.WithTimeout(h.ctx, 60*time.Second)
	defer cancel()
	_, err := api.Call(ctx, socket, api.Request{Op: api.OpAdd, Network: network, ContainerID: id, IfName: "eth0", Ranges: sets})
	return err
}

func (h *harness) hostLocalIPAM(network, subnet, netns string) *ipamSys {
	dataDir := filepath.Join(h.work, "host-local-"+network)
	conf := []byte(fmt.Sprintf(`{"cniVersion":%q,"name":%q,"type":"bench","ipam":{"type":"host-local","dataDir":%q,"ranges":%s}}`,
		cniVersion, network, dataDir, rangesJSON(subnet)))
	filled := 0
	return &ipamSys{name: "host-local", plugin: "host-local", conf: conf,
		fill: func(n int) error {
			from := filled
			filled = max(filled, n)
			return parallel(n-from, 4, func(i int) error {
				_, _, err := h.exec(call{plugin: "host-local", command: "ADD", containerID: fmt.Sprintf("fill-%05d", from+i), netns: netns, conf: conf})
				return err
			})
		},
		live: func() (int, error) {
			ents, err := os.ReadDir(filepath.Join(dataDir, network))
			if os.IsNotExist(err) {
				return 0, nil
			}
			n := 0
			for _, e := range ents {
				if e.Name() != "lock" && e.Name()[0] != 'l' { // lock, last_reserved_ip.0
					n++
				}
			}
			return n, err
		}}
}

// ipamLatency measures ADD and DEL of both IPAM plugins and the floor, interleaved,
// at each fill of a /22.
func (h *harness) ipamLatency() error {
	netns, err := h.newNetNS("ipam")
	if err != nil {
		return err
	}
	defer h.delNetNS(netns)
	if err := h.startBound(); err != nil {
		return fmt.Errorf("the lower bound: %w", err)
	}
	var boundVsFloor, boundVsDel, boundVsDelP99 []string
	systems := []*ipamSys{h.ipledgerIPAM(ipamNetIPL, h.sized(subnetIPAMIPL)), h.hostLocalIPAM(ipamNetHL, h.sized(subnetIPAMHL), netns)}
	for _, pct := range fills {
		want := int(math.Round(float64(pct) / 100 * float64(usable(h.opts.PoolBits))))
		t0 := time.Now()
		for _, s := range systems {
			if err := s.fill(want); err != nil {
				return fmt.Errorf("filling %s to %d%%: %w", s.name, pct, err)
			}
		}
		h.log.Info("bench: pools filled", "fill", pct, "leases", want, "took", time.Since(t0).Round(time.Millisecond))
		add := make([]dist, len(systems))
		del := make([]dist, len(systems))
		var floor, bound dist
		for i := 0; i < h.opts.Samples; i++ {
			if err := h.ctx.Err(); err != nil {
				return err
			}
			id := fmt.Sprintf("lat%02d-%05d", pct, i)
			// alternate which plugin goes first, so neither always follows the other
			order := []int{0, 1}
			if i%2 == 1 {
				order = []int{1, 0}
			}
			for _, j := range order {
				d, out, err := h.exec(call{plugin: systems[j].plugin, command: "ADD", containerID: id, netns: netns, conf: systems[j].conf})
				if err != nil {
					return err
				}
				if err := checkResult(out); err != nil {
					return fmt.Errorf("%s ADD: %w", systems[j].name, err)
				}
				add[j] = append(add[j], d)
			}
			d, err := h.floor(nil)
			if err != nil {
				return err
			}
			floor = append(floor, d)
			if d, err = h.bound(systems[0].conf); err != nil {
				return err
			}
			bound = append(bound, d)
			for _, j := range order {
				d, _, err := h.exec(call{plugin: systems[j].plugin, command: "DEL", containerID: id, netns: netns, conf: systems[j].conf})
				if err != nil {
					return err
				}
				del[j] = append(del[j], d)
			}
		}
		for _, s := range systems {
			n, err := s.live()
			if err != nil {
				return err
			}
			if n != want {
				return fmt.Errorf("%s: %d live leases after the %d%% run, want %d", s.name, n, pct, want)
			}
		}
		name := func(verb, q string) string { return fillName(verb, pct, q, h.opts.PoolBits) }
		h.row(groupIPAM, name("ADD", "p50"), "ms", add[0].p50(), add[1].p50(), floor.p50())
		h.row(groupIPAM, name("ADD", "p99"), "ms", add[0].p99(), add[1].p99(), floor.p99())
		h.row(groupIPAM, name("DEL", "p50"), "ms", del[0].p50(), del[1].p50(), floor.p50())
		h.row(groupIPAM, name("DEL", "p99"), "ms", del[0].p99(), del[1].p99(), floor.p99())
		h.row(groupIPAM, boundName(pct, "p50", h.opts.PoolBits), "ms", bound.p50(), del[1].p50(), floor.p50())
		h.row(groupIPAM, boundName(pct, "p99", h.opts.PoolBits), "ms", bound.p99(), del[1].p99(), floor.p99())
		boundVsFloor = append(boundVsFloor, fmt.Sprintf("%.2f×", bound.p50()/floor.p50()))
		boundVsDel = append(boundVsDel, fmt.Sprintf("%.2f×", bound.p50()/del[1].p50()))
		boundVsDelP99 = append(boundVsDelP99, fmt.Sprintf("%.2f×", bound.p99()/del[1].p99()))
	}
	h.note("Lower bound at 0%%, 50%% and 95%%: %s the floor, %s host-local's DEL p50, %s its DEL p99. A goal below these cannot be met by any plugin of this design on this machine; it tells what is left to the plugin and agent (ipledger minus the bound).", strings.Join(boundVsFloor, ", "), strings.Join(boundVsDel, ", "), strings.Join(boundVsDelP99, ", "))
	h.note("Lower bound rows: the least a durable IPAM plugin of this design can do in Go, measured in the same loop: a static Go binary that reads stdin, sends it over a unix socket and prints the answer, to a server that does one 512-byte pwrite and one fdatasync per request (the issue's limit, floor + one socket round trip + one sync, measured instead of estimated); its baseline is host-local's DEL p50 at that fill, the cheaper of host-local's verbs. Source: internal/bench/bound.go.")
	h.note("IPAM rows: %d ADD+DEL pairs per plugin and fill, interleaved with one floor exec each; a fill is the share of the /%d pool's %d usable addresses held by live leases (filled by real ADDs: host-local by exec, ipledger through the agent's socket API). The agent runs with --reuse-delay %s so a released address can be taken again at once, as host-local does.", h.opts.Samples, h.opts.PoolBits, usable(h.opts.PoolBits), reuseDelayParam)
	return nil
}

// checkResult checks that a plugin's ADD answered a CNI result with an address.
func checkResult(out []byte) error {
	var r struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return fmt.Errorf("result %q: %v", out, err)
	}
	if len(r.IPs) == 0 || r.IPs[0].Address == "" {
		return fmt.Errorf("result without an address: %s", out)
	}
	return nil
}

func burstName(verb string) string { return verb + " burst, wall time (median)" }

// ipamBurst measures bursts of concurrent ADDs (then DELs) of both IPAM plugins and
// of the floor, alternating, and reports the median wall time.
func (h *harness) ipamBurst() error {
	netns, err := h.newNetNS("burst")
	if err != nil {
		return err
	}
	defer h.delNetNS(netns)
	systems := []*ipamSys{h.ipledgerIPAM(burstNetIPL, subnetBurstIPL), h.hostLocalIPAM(burstNetHL, subnetBurstHL, netns)}
	n := h.opts.BurstSize
	var adds, dels [2]dist
	var floor dist
	for rep := 0; rep < h.opts.BurstReps; rep++ {
		if err := h.ctx.Err(); err != nil {
			return err
		}
		order := []int{0, 1}
		if rep%2 == 1 {
			order = []int{1, 0}
		}
		for _, j := range order {
			s := systems[j]
			id := func(i int) string { return fmt.Sprintf("burst%02d-%04d", rep, i) }
			d, err := burst(n, func(i int) error {
				_, out, err := h.exec(call{plugin: s.plugin, command: "ADD", containerID: id(i), netns: netns, conf: s.conf})
				if err == nil {
					err = checkResult(out)
				}
				return err
			})
			if err != nil {
				return fmt.Errorf("%s ADD burst: %w", s.name, err)
			}
			adds[j] = append(adds[j], d)
			if live, err := s.live(); err != nil || live != n {
				return fmt.Errorf("%s: %d live leases after a burst of %d ADDs (%v)", s.name, live, n, err)
			}
			d, err = burst(n, func(i int) error {
				_, _, err := h.exec(call{plugin: s.plugin, command: "DEL", containerID: id(i), netns: netns, conf: s.conf})
				return err
			})
			if err != nil {
				return fmt.Errorf("%s DEL burst: %w", s.name, err)
			}
			dels[j] = append(dels[j], d)
		}
		d, err := burst(n, func(int) error { _, err := h.floor(nil); return err })
		if err != nil {
			return err
		}
		floor = append(floor, d)
	}
	h.row(groupBurst, burstName("ADD"), "ms", adds[0].p50(), adds[1].p50(), floor.p50())
	h.row(groupBurst, burstName("DEL"), "ms", dels[0].p50(), dels[1].p50(), floor.p50())
	h.note("Bursts: %d concurrent execs released together, wall time until the last answered; median of %d bursts per system, alternating; the floor is %d concurrent no-op execs.", n, h.opts.BurstReps, n)
	return nil
}
