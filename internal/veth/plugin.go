// Package veth is the ipledger-veth CNI main plugin: a routed veth pair per
// attachment, addresses delegated to the IPAM plugin of the ipam section, and a
// network-namespace identity guard so that a stale or reused CNI_NETNS can never
// make the plugin touch the host's namespace.
//
// Layout of one attachment (network N, container C, interface I):
//
//	pod netns:  I (veth)  addr/32, addr/128, lo up,
//	            169.254.1.1 dev I scope link; default via 169.254.1.1 dev I
//	            default via fe80::1 dev I; permanent neighbours for both gateways
//	host:       PREFIX+hash(N,C,I) (veth) alias "ipledger-veth net=N cid=C if=I netns=DEV:INO"
//	            proxy_arp=1, forwarding=1, rp_filter=2 (this interface only), fe80::1/64
//	            addr/32 dev host-veth, addr/128 dev host-veth
//
// DEL works from the host side only and never opens CNI_NETNS.
package veth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
)

// SupportedVersions are the CNI spec versions the plugin speaks.
var SupportedVersions = version.PluginSupports("0.3.1", "0.4.0", "1.0.0", "1.1.0")

// Plugin implements the CNI verbs; its fields are the process edges.
type Plugin struct {
	Stdout  io.Writer     // the CNI result goes here, nothing else
	Logger  *slog.Logger  // diagnostics (stderr in the binary)
	IPAM    IPAM          // delegated address management
	Timeout time.Duration // per call; 0 means 60s
}

func (p *Plugin) ctx() (context.Context, context.CancelFunc) {
	d := p.Timeout
	if d == 0 {
		d = 60 * time.Second
	}
	return context.WithTimeout(context.Background(), d)
}

func ipamCall(conf *NetConf, args *skel.CmdArgs, netns string) IPAMCall {
	return IPAMCall{Type: conf.IPAM.Type, NetConf: args.StdinData, ContainerID: args.ContainerID,
		NetNS: netns, IfName: args.IfName, Args: args.Args, Path: args.Path}
}

// toCNIError maps our sentinels to CNI error codes; IPAM errors pass unchanged.
func toCNIError(err error) error {
	if err == nil {
		return nil
	}
	var te *types.Error
	if errors.As(err, &te) {
		if te.Msg == err.Error() {
			return te
		}
		return types.NewError(te.Code, err.Error(), te.Details)
	}
	code := types.ErrInternal
	switch {
	case errors.Is(err, ErrConfig):
		code = types.ErrInvalidNetworkConfig
	case errors.Is(err, ErrNotNetNS), errors.Is(err, ErrHostNetNS), errors.Is(err, ErrNetNSMismatch):
		code = types.ErrInvalidNetNS
	case errors.Is(err, ErrNoAttachment):
		code = types.ErrUnknownContainer
	}
	return types.NewError(code, err.Error(), "")
}

// Add is CNI ADD.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	ctx, cancel := p.ctx()
	defer cancel()
	res, conf, err := p.add(ctx, args)
	if err != nil {
		p.Logger.Error("ADD failed", "containerID", args.ContainerID, "ifname", args.IfName, "err", err)
		return toCNIError(err)
	}
	out, err := res.GetAsVersion(conf.CNIVersion)
	if err != nil {
		return toCNIError(fmt.Errorf("convert result to %s: %w", conf.CNIVersion, err))
	}
	return toCNIError(out.PrintTo(p.Stdout))
}

func (p *Plugin) add(ctx context.Context, args *skel.CmdArgs) (_ *current.Result, _ *NetConf, err error) {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return nil, nil, err
	}
	hostName := HostVethName(conf.HostVethPrefix, conf.Name, args.ContainerID, args.IfName)

	// Namespace guard before anything is created or allocated.
	pod, err := OpenNetNS(args.Netns)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = pod.Close() }()
	if err := guardNotHost(pod.ID, args.Netns); err != nil {
		return nil, nil, err
	}
	alias, err := Attachment{Network: conf.Name, ContainerID: args.ContainerID, IfName: args.IfName, NetNS: pod.ID}.Alias()
	if err != nil {
		return nil, nil, err
	}

	hh, err := netlinksafe.NewHandle()
	if err != nil {
		return nil, nil, fmt.Errorf("netlink: %w", err)
	}
	defer hh.Close()
	h := &hh
	mtu := conf.MTU
	if mtu == 0 {
		if mtu, err = uplinkMTU(h); err != nil {
			return nil, nil, err
		}
	}

	// A leftover of an earlier ADD of this very attachment is replaced; a foreign
	// interface with our name is never touched.
	old, oldAtt, found, err := ownedLink(h, hostName)
	if err != nil {
		return nil, nil, err
	}
	if found {
		if !oldAtt.Matches(conf.Name, args.ContainerID, args.IfName) {
			return nil, nil, fmt.Errorf("%w: %s belongs to %+v", ErrNotOurs, hostName, oldAtt)
		}
		p.Logger.Warn("replacing host veth left by an earlier ADD", "link", hostName, "alias", old.Attrs().Alias)
		if err := removeHostLink(h, old); err != nil {
			return nil, nil, err
		}
	}

	call := ipamCall(conf, args, args.Netns)
	r, err := p.IPAM.Add(ctx, call)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err == nil {
			return
		}
		del := call
		del.NetNS = ""
		// A fresh deadline: the ADD's own may be what ran out.
		rctx, rcancel := p.ctx()
		defer rcancel()
		if derr := p.IPAM.Del(rctx, del); derr != nil {
			p.Logger.Error("rollback: IPAM DEL failed", "err", derr)
			err = fmt.Errorf("%w (rollback IPAM DEL: %v)", err, derr)
		}
	}()
	result, err := current.NewResultFromResult(r)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrIPAMResult, err)
	}
	if len(result.IPs) == 0 {
		return nil, nil, fmt.Errorf("%w: IPAM plugin %q returned no addresses", ErrIPAMResult, conf.IPAM.Type)
	}
	var ips []net.IP
	for _, ipc := range result.IPs {
		if ipc.Address.IP == nil {
			return nil, nil, fmt.Errorf("%w: empty address", ErrIPAMResult)
		}
		ips = append(ips, ipc.Address.IP)
	}
	var extra []*net.IPNet
	for _, rt := range result.Routes {
		d := rt.Dst
		extra = append(extra, &d)
	}

	hostLink, err := createVeth(h, hostName, alias, mtu, args.IfName, pod)
	if hostLink != nil {
		defer func() {
			if err != nil {
				if derr := removeHostLink(h, hostLink); derr != nil {
					p.Logger.Error("rollback: delete host veth failed", "link", hostName, "err", derr)
					err = fmt.Errorf("%w (rollback delete %s: %v)", err, hostName, derr)
				}
			}
		}()
	}
	if err != nil {
		return nil, nil, err
	}
	if err = configureHost(h, hostLink, ips); err != nil {
		return nil, nil, err
	}
	ph, err := podHandle(pod)
	if err != nil {
		return nil, nil, err
	}
	defer ph.Close()
	podLink, err := configurePod(ph, args.IfName, ips, hostLink.Attrs().HardwareAddr, extra)
	if err != nil {
		return nil, nil, err
	}

	out := &current.Result{CNIVersion: current.ImplementedSpecVersion, DNS: result.DNS}
	if conf.DNS.Nameservers != nil || conf.DNS.Search != nil || conf.DNS.Options != nil || conf.DNS.Domain != "" {
		out.DNS = conf.DNS
	}
	out.Interfaces = []*current.Interface{
		{Name: hostName, Mac: hostLink.Attrs().HardwareAddr.String(), Mtu: mtu},
		{Name: args.IfName, Mac: podLink.Attrs().HardwareAddr.String(), Mtu: mtu, Sandbox: args.Netns},
	}
	seen := map[int]bool{}
	for _, ip := range ips {
		gw := gatewayFor(ip)
		out.IPs = append(out.IPs, &current.IPConfig{Interface: current.Int(1), Address: *hostNet(ip), Gateway: gw})
		fam := family(ip)
		if seen[fam] {
			continue
		}
		seen[fam] = true
		out.Routes = append(out.Routes, &types.Route{Dst: *defaultNet(fam), GW: gw})
		for _, d := range extra {
			if family(d.IP) == fam && !isDefault(d) {
				out.Routes = append(out.Routes, &types.Route{Dst: *d, GW: gw})
			}
		}
	}
	p.Logger.Info("ADD", "containerID", args.ContainerID, "ifname", args.IfName, "hostVeth", hostName, "netns", pod.ID.String())
	return out, conf, nil
}

// Del is CNI DEL. It works from the host side only: it never opens, stats or
// enters CNI_NETNS.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	ctx, cancel := p.ctx()
	defer cancel()
	err := p.del(ctx, args)
	// skel compares CNI_NETNS with the plugin's namespace after a successful DEL and
	// fails it when they are equal (a reused /proc/PID/ns/net after a reboot). DEL
	// does not use CNI_NETNS at all, so that check must not turn a completed
	// teardown into an error that the runtime retries forever.
	args.Netns = ""
	if err != nil {
		p.Logger.Error("DEL failed", "containerID", args.ContainerID, "ifname", args.IfName, "err", err)
	}
	return toCNIError(err)
}

func (p *Plugin) del(ctx context.Context, args *skel.CmdArgs) error {
	conf, warnings, err := ParseDelConfig(args.StdinData)
	if err != nil {
		return err
	}
	for _, w := range warnings {
		p.Logger.Warn("DEL: config field set aside", "why", w)
	}
	hh, err := netlinksafe.NewHandle()
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer hh.Close()
	h := &hh
	link, err := findAttachmentLink(h, conf, args.ContainerID, args.IfName)
	switch {
	case errors.Is(err, ErrNotOurs):
		// Someone else's interface: leave it, still release our lease.
		p.Logger.Warn("DEL: not deleting interface that is not ours", "err", err)
		link = nil
	case err != nil:
		return err
	}
	call := ipamCall(conf, args, "")
	if link == nil {
		return p.IPAM.Del(ctx, call)
	}
	// The host routes go first: once they are gone, nothing on the node sends the
	// pod's addresses to this veth, so the IPAM plugin may release them. Deleting
	// the veth itself waits in the kernel for RCU grace periods (strace: 16 ms of a
	// DEL here, its largest part); the IPAM DEL, a process of its own, runs
	// meanwhile instead of after it. A failure of either fails the DEL, and a
	// retried DEL finishes the rest (both halves succeed on what is already gone).
	if err := removeHostRoutes(h, link); err != nil {
		return err
	}
	released := make(chan error, 1)
	go func() { released <- p.IPAM.Del(ctx, call) }()
	lerr := deleteLink(h, link)
	return errors.Join(lerr, <-released)
}

// findAttachmentLink returns the host-side veth of the attachment: by its
// deterministic name, or (if hostVethPrefix changed since ADD) by scanning for a
// veth whose alias records the attachment. nil, nil when there is none.
func findAttachmentLink(h *netlinksafe.Handle, conf *NetConf, containerID, ifName string) (netlink.Link, error) {
	name := HostVethName(conf.HostVethPrefix, conf.Name, containerID, ifName)
	link, att, found, err := ownedLink(h, name)
	if err != nil {
		return nil, err
	}
	if found {
		if !att.Matches(conf.Name, containerID, ifName) {
			return nil, fmt.Errorf("%w: %s records %+v", ErrNotOurs, name, att)
		}
		return link, nil
	}
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		if a, ok := ours(l); ok && a.Matches(conf.Name, containerID, ifName) {
			return l, nil
		}
	}
	return nil, nil
}

// Check is CNI CHECK.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	ctx, cancel := p.ctx()
	defer cancel()
	err := p.check(ctx, args)
	if err != nil {
		p.Logger.Error("CHECK failed", "containerID", args.ContainerID, "ifname", args.IfName, "err", err)
	}
	return toCNIError(err)
}

func (p *Plugin) check(ctx context.Context, args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	if conf.RawPrevResult == nil {
		return fmt.Errorf("%w: prevResult missing", ErrConfig)
	}
	if err := version.ParsePrevResult(&conf.NetConf); err != nil {
		return fmt.Errorf("%w: prevResult: %v", ErrConfig, err)
	}
	prev, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return fmt.Errorf("%w: prevResult: %v", ErrConfig, err)
	}
	hh, err := netlinksafe.NewHandle()
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer hh.Close()
	h := &hh
	hostName := HostVethName(conf.HostVethPrefix, conf.Name, args.ContainerID, args.IfName)
	hostLink, att, found, err := ownedLink(h, hostName)
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("%w: no host veth %s", ErrNoAttachment, hostName)
	}
	if !att.Matches(conf.Name, args.ContainerID, args.IfName) {
		return fmt.Errorf("%w: %s records %+v", ErrNotOurs, hostName, att)
	}

	// Identity guard: enter only the namespace recorded at ADD.
	pod, err := OpenNetNS(args.Netns)
	if err != nil {
		return err
	}
	defer func() { _ = pod.Close() }()
	if pod.ID != att.NetNS {
		return fmt.Errorf("%w: %q is %s, ADD recorded %s", ErrNetNSMismatch, args.Netns, pod.ID, att.NetNS)
	}
	if err := guardNotHost(pod.ID, args.Netns); err != nil {
		return err
	}

	var podIf, hostIf *current.Interface
	for _, i := range prev.Interfaces {
		switch {
		case i.Name == args.IfName && i.Sandbox != "":
			podIf = i
		case i.Name == hostName && i.Sandbox == "":
			hostIf = i
		}
	}
	if podIf == nil || hostIf == nil {
		return fmt.Errorf("%w: prevResult lacks interface %s or %s", ErrCheckFailed, args.IfName, hostName)
	}
	if err := checkHost(h, hostLink, hostIf, prev); err != nil {
		return err
	}
	ph, err := podHandle(pod)
	if err != nil {
		return err
	}
	defer ph.Close()
	if err := checkPod(ph, args.IfName, hostLink, podIf, prev); err != nil {
		return err
	}
	return p.IPAM.Check(ctx, ipamCall(conf, args, args.Netns))
}

func checkHost(h *netlinksafe.Handle, link netlink.Link, want *current.Interface, prev *current.Result) error {
	a := link.Attrs()
	if want.Mac != "" && want.Mac != a.HardwareAddr.String() {
		return fmt.Errorf("%w: host %s mac %s, prevResult %s", ErrCheckFailed, a.Name, a.HardwareAddr, want.Mac)
	}
	if a.Flags&net.FlagUp == 0 {
		return fmt.Errorf("%w: host %s is down", ErrCheckFailed, a.Name)
	}
	routes, err := h.RouteList(link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("host routes of %s: %w", a.Name, err)
	}
	for _, ipc := range prev.IPs {
		dst := hostNet(ipc.Address.IP)
		if !slices.ContainsFunc(routes, func(r netlink.Route) bool { return r.Dst != nil && r.Dst.String() == dst.String() }) {
			return fmt.Errorf("%w: host route %s dev %s missing", ErrCheckFailed, dst, a.Name)
		}
	}
	return nil
}

func checkPod(ph *netlinksafe.Handle, ifName string, hostLink netlink.Link, want *current.Interface, prev *current.Result) error {
	link, err := ph.LinkByName(ifName)
	if err != nil {
		return fmt.Errorf("%w: pod %s: %v", ErrCheckFailed, ifName, err)
	}
	if _, ok := link.(*netlink.Veth); !ok {
		return fmt.Errorf("%w: pod %s is %s, not veth", ErrCheckFailed, ifName, link.Type())
	}
	a := link.Attrs()
	if want.Mac != "" && want.Mac != a.HardwareAddr.String() {
		return fmt.Errorf("%w: pod %s mac %s, prevResult %s", ErrCheckFailed, ifName, a.HardwareAddr, want.Mac)
	}
	if a.ParentIndex != hostLink.Attrs().Index || hostLink.Attrs().ParentIndex != a.Index {
		return fmt.Errorf("%w: pod %s is not the peer of %s", ErrCheckFailed, ifName, hostLink.Attrs().Name)
	}
	if a.Flags&net.FlagUp == 0 {
		return fmt.Errorf("%w: pod %s is down", ErrCheckFailed, ifName)
	}
	addrs, err := ph.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("pod addresses: %w", err)
	}
	for _, ipc := range prev.IPs {
		if !slices.ContainsFunc(addrs, func(ad netlink.Addr) bool { return ad.IP.Equal(ipc.Address.IP) }) {
			return fmt.Errorf("%w: pod address %s missing on %s", ErrCheckFailed, ipc.Address.IP, ifName)
		}
	}
	routes, err := ph.RouteList(link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("pod routes: %w", err)
	}
	for _, want := range prev.Routes {
		ok := slices.ContainsFunc(routes, func(r netlink.Route) bool {
			dst := r.Dst
			if dst == nil {
				dst = defaultNet(family(want.Dst.IP))
			}
			return dst.String() == want.Dst.String() && (want.GW == nil || want.GW.Equal(r.Gw))
		})
		if !ok {
			return fmt.Errorf("%w: pod route %s via %s missing", ErrCheckFailed, want.Dst.String(), want.GW)
		}
	}
	return nil
}

// GC is CNI GC: it removes this network's host-side veths (and their routes)
// whose attachment is not in cni.dev/valid-attachments, then delegates IPAM GC.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	ctx, cancel := p.ctx()
	defer cancel()
	err := p.gc(ctx, args)
	if err != nil {
		p.Logger.Error("GC failed", "err", err)
	}
	return toCNIError(err)
}

func (p *Plugin) gc(ctx context.Context, args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	list := conf.ValidAttachments
	if list == nil {
		list = conf.Attachments
	}
	if list == nil {
		// Without the list every veth of the network would look stale: remove
		// nothing rather than cut live pods off.
		return fmt.Errorf("%w: cni.dev/valid-attachments: missing; GC needs the list of valid attachments", ErrConfig)
	}
	valid := map[[2]string]bool{}
	for _, a := range list {
		valid[[2]string{a.ContainerID, a.IfName}] = true
	}
	hh, err := netlinksafe.NewHandle()
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer hh.Close()
	h := &hh
	links, err := h.LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	var errs []error
	for _, l := range links {
		att, ok := ours(l)
		if !ok || att.Network != conf.Name || valid[[2]string{att.ContainerID, att.IfName}] {
			continue
		}
		p.Logger.Info("GC: removing stale host veth", "link", l.Attrs().Name, "alias", l.Attrs().Alias)
		if err := removeHostLink(h, l); err != nil {
			errs = append(errs, err)
		}
	}
	unsupported, err := p.IPAM.GC(ctx, ipamCall(conf, args, ""))
	if unsupported {
		p.Logger.Warn("GC: IPAM plugin does not support CNI 1.1.0 GC; leases not collected", "ipam", conf.IPAM.Type)
	}
	return errors.Join(append(errs, err)...)
}

// Status is CNI STATUS, delegated to IPAM.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	ctx, cancel := p.ctx()
	defer cancel()
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return toCNIError(err)
	}
	unsupported, err := p.IPAM.Status(ctx, ipamCall(conf, args, ""))
	if unsupported {
		p.Logger.Debug("STATUS: IPAM plugin predates CNI 1.1.0; it answered VERSION, treating as available", "ipam", conf.IPAM.Type)
	}
	return toCNIError(err)
}
