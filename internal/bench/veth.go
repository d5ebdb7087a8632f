package bench

import (
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/ipledger/ipledger/internal/nsenter"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// mainSys is one main plugin with its IPAM: the whole pod network setup.
type mainSys struct {
	name, plugin, network, subnet string
	conf                          []byte
}

// mainPlugin measures the pod network setup: ipledger-veth with ipledger against ptp
// with host-local, ADD and DEL into real namespaces, one pod at a time and in bursts.
// The plugins run inside a node namespace the step makes, never the caller's: their
// host sides (veths, routes, ptp's global ip_forward) would otherwise land on the
// host, where a node of another test may be running, and writing the host's
// ip_forward back resets the forwarding of every interface on it.
func (h *harness) mainPlugin() error {
	nodePath, err := h.newNetNS("node")
	if err != nil {
		return err
	}
	defer h.delNetNS(nodePath)
	node, err := os.Open(nodePath)
	if err != nil {
		return err
	}
	defer node.Close()
	defer h.checkNoLeftovers(node)
	systems := []*mainSys{
		{name: "ipledger-veth + ipledger", plugin: "ipledger-veth", network: vethNetIPL, subnet: subnetVethIPL,
			conf: []byte(fmt.Sprintf(`{"cniVersion":%q,"name":%q,"type":"ipledger-veth","ipam":%s}`, cniVersion, vethNetIPL, h.agent.IPAM(rangesJSON(subnetVethIPL))))},
		{name: "ptp + host-local", plugin: "ptp", network: vethNetPTP, subnet: subnetVethPTP,
			conf: []byte(fmt.Sprintf(`{"cniVersion":%q,"name":%q,"type":"ptp","ipMasq":false,"ipam":{"type":"host-local","dataDir":%q,"ranges":%s}}`,
				cniVersion, vethNetPTP, h.work+"/host-local-"+vethNetPTP, rangesJSON(subnetVethPTP)))},
	}
	var add, del [2]dist
	var floor dist
	for i := 0; i < h.opts.VethSamples; i++ {
		if err := h.ctx.Err(); err != nil {
			return err
		}
		order := []int{0, 1}
		if i%2 == 1 {
			order = []int{1, 0}
		}
		for _, j := range order {
			s := systems[j]
			ns, err := h.newNetNS("v")
			if err != nil {
				return err
			}
			id := fmt.Sprintf("pod-%05d", i)
			d, out, err := h.exec(call{plugin: s.plugin, command: "ADD", containerID: id, netns: ns, conf: s.conf, node: node})
			if err != nil {
				return err
			}
			if err := checkResult(out); err != nil {
				return fmt.Errorf("%s ADD: %w", s.name, err)
			}
			add[j] = append(add[j], d)
			d, _, err = h.exec(call{plugin: s.plugin, command: "DEL", containerID: id, netns: ns, conf: s.conf, node: node})
			if err != nil {
				return err
			}
			del[j] = append(del[j], d)
			if err := h.delNetNS(ns); err != nil {
				return err
			}
		}
		d, err := h.floor(node)
		if err != nil {
			return err
		}
		floor = append(floor, d)
	}
	h.row(groupMain, "ADD p50", "ms", add[0].p50(), add[1].p50(), floor.p50())
	h.row(groupMain, "ADD p99", "ms", add[0].p99(), add[1].p99(), floor.p99())
	h.row(groupMain, "DEL p50", "ms", del[0].p50(), del[1].p50(), floor.p50())
	h.row(groupMain, "DEL p99", "ms", del[0].p99(), del[1].p99(), floor.p99())

	n := h.opts.BurstSize
	var badd, bdel [2]dist
	var bfloor dist
	for rep := 0; rep < h.opts.VethReps; rep++ {
		order := []int{0, 1}
		if rep%2 == 1 {
			order = []int{1, 0}
		}
		for _, j := range order {
			s := systems[j]
			nss := make([]string, n)
			if err := parallel(n, 4, func(i int) (err error) { nss[i], err = h.newNetNS("b"); return err }); err != nil {
				return err
			}
			id := func(i int) string { return fmt.Sprintf("bpod%02d-%04d", rep, i) }
			d, err := burst(n, func(i int) error {
				_, out, err := h.exec(call{plugin: s.plugin, command: "ADD", containerID: id(i), netns: nss[i], conf: s.conf, node: node})
				if err == nil {
					err = checkResult(out)
				}
				return err
			})
			if err != nil {
				return fmt.Errorf("%s ADD burst: %w", s.name, err)
			}
			badd[j] = append(badd[j], d)
			d, err = burst(n, func(i int) error {
				_, _, err := h.exec(call{plugin: s.plugin, command: "DEL", containerID: id(i), netns: nss[i], conf: s.conf, node: node})
				return err
			})
			if err != nil {
				return fmt.Errorf("%s DEL burst: %w", s.name, err)
			}
			bdel[j] = append(bdel[j], d)
			if err := parallel(n, 4, func(i int) error { return h.delNetNS(nss[i]) }); err != nil {
				return err
			}
		}
		d, err := burst(n, func(int) error { _, err := h.floor(node); return err })
		if err != nil {
			return err
		}
		bfloor = append(bfloor, d)
	}
	h.row(groupMain, burstName("ADD"), "ms", badd[0].p50(), badd[1].p50(), bfloor.p50())
	h.row(groupMain, burstName("DEL"), "ms", bdel[0].p50(), bdel[1].p50(), bfloor.p50())
	h.note("Main plugin rows: ipledger-veth delegating to ipledger vs ptp (ipMasq off) delegating to host-local, each ADD into a fresh namespace made by `ip netns add` (not timed), with an empty pool; %d pods one at a time, then %d bursts of %d pods per system (median).", h.opts.VethSamples, h.opts.VethReps, n)
	return nil
}

// checkNoLeftovers reports links or routes of the main plugin pools that the run
// left behind in the node namespace.
func (h *harness) checkNoLeftovers(node *os.File) {
	nh, err := nsenter.Handle(int(node.Fd()), unix.NETLINK_ROUTE)
	if err != nil {
		h.tb.Errorf("netlink in the node namespace: %v", err)
		return
	}
	nl := netlinksafe.Handle{Handle: nh}
	defer nl.Close()
	links, err := nl.LinkList()
	if err != nil {
		h.tb.Errorf("listing links: %v", err)
		return
	}
	for _, l := range links {
		if a := l.Attrs().Alias; strings.Contains(a, "net="+vethNetIPL+" ") {
			h.tb.Errorf("leftover host veth %s (%s)", l.Attrs().Name, a)
		}
	}
	routes, err := nl.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		h.tb.Errorf("listing routes: %v", err)
		return
	}
	for _, s := range []string{subnetVethIPL, subnetVethPTP} {
		_, pfx, _ := net.ParseCIDR(s)
		for _, r := range routes {
			if r.Dst != nil && pfx.Contains(r.Dst.IP) {
				h.tb.Errorf("leftover route %s", r)
			}
		}
	}
}
