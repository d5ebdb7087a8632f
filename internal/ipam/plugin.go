package ipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cniplugin"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/spool"
)

// Versions are the CNI versions the plugin speaks.
var Versions = []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// Plugin error codes beyond the spec's well-known ones.
const (
	ErrPoolExhausted uint = 100 // no address free in the network's pool
	ErrCheckFailed   uint = 101 // CHECK found the attachment without its lease
	ErrAgent         uint = 102 // the agent failed in a way not listed above
)

// Plugin holds the process edges: how to reach the agent, where to write results and
// notes, the clock.
type Plugin struct {
	Call   api.CallFunc
	Stdout io.Writer
	Stderr io.Writer
	Now    func() time.Time
	// NetNS reads the identity of the network namespace at a path: CNI_NETNS, or
	// SelfNetNS for the plugin's own; nil means NetNSID.
	NetNS api.NetNSFunc
}

func (p *Plugin) netns(path string) api.NetNS {
	if p.NetNS == nil {
		return NetNSID(path)
	}
	return p.NetNS(path)
}

// SelfNetNS is the path of the calling process's own network namespace: the plugin's,
// or a main plugin's that hands a call over (Forward), whose identity the agent then
// answers for it.
const SelfNetNS = "/proc/self/ns/net"

// New returns a plugin on the real process edges.
func New() *Plugin {
	return &Plugin{Call: api.Call, Stdout: os.Stdout, Stderr: os.Stderr, Now: time.Now}
}

// Funcs are the plugin's verbs for cniplugin.Main.
func (p *Plugin) Funcs() cniplugin.Funcs {
	return cniplugin.Funcs{Add: p.Add, Del: p.Del, Check: p.Check, GC: p.GC, Status: p.Status}
}

func (p *Plugin) call(conf *NetConf, req api.Request) (*api.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), conf.IPAM.timeout)
	defer cancel()
	return p.Call(ctx, conf.IPAM.Socket, req)
}

// toCNI maps an agent error to the CNI error a runtime sees.
func toCNI(err error, socket string) *cniplugin.Error {
	if errors.Is(err, api.ErrUnreachable) {
		return cniplugin.NewError(cniplugin.ErrTryAgainLater, fmt.Sprintf("ipledgerd is not reachable on %s; try again later", socket), err.Error())
	}
	if errors.Is(err, api.ErrNoAnswer) {
		return cniplugin.NewError(cniplugin.ErrTryAgainLater, fmt.Sprintf("ipledgerd on %s gave no answer; try again later", socket), err.Error())
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case api.CodeExhausted:
			return cniplugin.NewError(ErrPoolExhausted, ae.Msg, "")
		case api.CodeConflict:
			return cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, ae.Msg, "")
		case api.CodeInvalid:
			return cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, ae.Msg, "")
		case api.CodeNotFound, api.CodeMismatch:
			return cniplugin.NewError(ErrCheckFailed, ae.Msg, "")
		case api.CodeStore:
			return cniplugin.NewError(cniplugin.ErrIOFailure, ae.Msg, "")
		case api.CodeUnavailable:
			return cniplugin.NewError(cniplugin.ErrTryAgainLater, ae.Msg, "")
		}
		return cniplugin.NewError(ErrAgent, ae.Msg, "")
	}
	return cniplugin.NewError(cniplugin.ErrInternal, err.Error(), "")
}

func keyOf(conf *NetConf, args *cniplugin.Args) (api.Key, *cniplugin.Error) {
	k := api.Key{Network: conf.Name, ContainerID: args.ContainerID, IfName: args.IfName}
	if err := k.Validate(); err != nil {
		return k, cniplugin.NewError(cniplugin.ErrInvalidEnvironmentVariables, err.Error(), "")
	}
	return k, nil
}

// NetNSID reads the identity of the network namespace at path (CNI_NETNS, or the
// caller's own); zero but the path when it cannot be read.
func NetNSID(path string) api.NetNS {
	ns := api.NetNS{Path: path}
	var st syscall.Stat_t
	if path != "" && syscall.Stat(path, &st) == nil {
		ns.Dev, ns.Ino = st.Dev, st.Ino
	}
	return ns
}

var _ api.NetNSFunc = NetNSID

// Add allocates the attachment's addresses through the agent.
func (p *Plugin) Add(args *cniplugin.Args) error {
	conf, cerr := ParseConfig(args.StdinData, true)
	if cerr != nil {
		return cerr
	}
	k, kerr := keyOf(conf, args)
	if kerr != nil {
		return kerr
	}
	pod, perr := PodArgs(args.Args)
	if perr != nil {
		return perr
	}
	ns := p.netns(args.Netns)
	if self := p.netns(SelfNetNS); ns.Ino != 0 && ns.Ino == self.Ino && ns.Dev == self.Dev {
		return cniplugin.NewError(cniplugin.ErrInvalidNetNS, fmt.Sprintf("CNI_NETNS %s is the plugin's own (host) network namespace; refusing to allocate for it", args.Netns), "")
	}
	resp, err := p.call(conf, api.Request{Op: api.OpAdd, Network: k.Network, ContainerID: k.ContainerID, IfName: k.IfName,
		Ranges: conf.IPAM.ranges, BlockSize: conf.IPAM.BlockSize, Exclude: conf.IPAM.Exclude, Pod: pod, NetNS: ns})
	if err != nil {
		return toCNI(err, conf.IPAM.Socket)
	}
	if resp.Lease == nil {
		return cniplugin.NewError(ErrAgent, "agent answered ADD without a lease", "")
	}
	var result cniplugin.Result
	for i, s := range resp.Lease.IPs {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			return cniplugin.NewError(ErrAgent, fmt.Sprintf("agent answered a bad address %q", s), "")
		}
		ipc := cniplugin.IPConfig{Address: net.IPNet{IP: pfx.Addr().AsSlice(), Mask: net.CIDRMask(pfx.Bits(), pfx.Addr().BitLen())}}
		if i < len(resp.Lease.Gateways) && resp.Lease.Gateways[i] != "" {
			ipc.Gateway = net.ParseIP(resp.Lease.Gateways[i])
		}
		result.IPs = append(result.IPs, ipc)
	}
	result.Routes = conf.IPAM.Routes
	result.DNS = conf.DNS
	out, err := result.Encode(conf.CNIVersion)
	if err != nil {
		return cniplugin.NewError(cniplugin.ErrIncompatibleCNIVersion, err.Error(), "")
	}
	_, err = p.Stdout.Write(out)
	return err
}

// Del releases the attachment's lease. It never needs CNI_NETNS, reads only the
// fields that name the attachment and its agent (ParseDelConfig), succeeds for an
// unknown attachment and, when the agent is unreachable, spools the DEL durably where
// the agent serving the socket published its spool, and succeeds. With no published
// spool it fails (the runtime retries): a DEL answered success must be applied.
func (p *Plugin) Del(args *cniplugin.Args) error {
	// DEL never reads CNI_NETNS: a stale or reused path must not fail a release
	// (seed 003).
	conf, warnings, cerr := ParseDelConfig(args.StdinData)
	if cerr != nil {
		return cerr
	}
	for _, w := range warnings {
		fmt.Fprintln(p.Stderr, "ipledger: DEL:", w)
	}
	k, kerr := keyOf(conf, args)
	if kerr != nil {
		return kerr
	}
	pod, _ := PodArgs(args.Args) // DEL must not fail on CNI_ARGS it does not need
	_, err := p.call(conf, api.Request{Op: api.OpDel, Network: k.Network, ContainerID: k.ContainerID, IfName: k.IfName})
	if err == nil {
		return nil
	}
	var ae *api.Error
	// an agent that died with the DEL in flight (no answer) may not have applied it:
	// spool it too (a release is idempotent) rather than fail a DEL the runtime may
	// never retry
	if errors.Is(err, api.ErrUnreachable) || errors.Is(err, api.ErrNoAnswer) || (errors.As(err, &ae) && ae.Code == api.CodeUnavailable) {
		socket := conf.IPAM.Socket
		dir, rerr := spool.Resolve(socket)
		if rerr != nil {
			return cniplugin.NewError(cniplugin.ErrTryAgainLater, fmt.Sprintf("ipledgerd is not reachable on %s and the DEL cannot be spooled: %v", socket, rerr), err.Error())
		}
		if serr := spool.Write(dir, spool.Entry{Key: k, Spooled: p.Now().UTC(), CNIVerb: "DEL", PodUID: pod.UID}); serr != nil {
			return cniplugin.NewError(cniplugin.ErrTryAgainLater, fmt.Sprintf("ipledgerd is not reachable on %s and the DEL could not be spooled in %s: %v", socket, dir, serr), err.Error())
		}
		fmt.Fprintf(p.Stderr, "ipledger: agent unreachable on %s; DEL of %s spooled in %s\n", socket, k, dir)
		return nil
	}
	return toCNI(err, conf.IPAM.Socket)
}

// Check verifies that the attachment holds its lease and the addresses of prevResult.
func (p *Plugin) Check(args *cniplugin.Args) error {
	conf, cerr := ParseConfig(args.StdinData, false)
	if cerr != nil {
		return cerr
	}
	k, kerr := keyOf(conf, args)
	if kerr != nil {
		return kerr
	}
	var ips []string
	if len(conf.RawPrevResult) > 0 && string(conf.RawPrevResult) != "null" {
		var cerr *cniplugin.Error
		if ips, cerr = prevResultIPs(conf.RawPrevResult); cerr != nil {
			return cerr
		}
	}
	_, err := p.call(conf, api.Request{Op: api.OpCheck, Network: k.Network, ContainerID: k.ContainerID, IfName: k.IfName, IPs: ips, NetNS: p.netns(args.Netns)})
	if err != nil {
		return toCNI(err, conf.IPAM.Socket)
	}
	return nil
}

// GC releases, reason GC, every lease of the network not in cni.dev/valid-attachments.
func (p *Plugin) GC(args *cniplugin.Args) error {
	conf, cerr := ParseConfig(args.StdinData, false)
	if cerr != nil {
		return cerr
	}
	valid := conf.ValidAttachments
	if valid == nil {
		valid = conf.Attachments
	}
	if valid == nil {
		// without the list every lease would look invalid: do nothing rather than
		// release live pods' addresses
		return cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, "cni.dev/valid-attachments: missing; GC needs the list of valid attachments", "")
	}
	if _, err := p.call(conf, api.Request{Op: api.OpGC, Network: conf.Name, Valid: valid}); err != nil {
		return toCNI(err, conf.IPAM.Socket)
	}
	return nil
}

// Status reports whether the plugin can serve ADDs: the agent answers and the
// network's pool has an address to give.
func (p *Plugin) Status(args *cniplugin.Args) error {
	conf, cerr := ParseConfig(args.StdinData, false)
	if cerr != nil {
		return cerr
	}
	req := api.Request{Op: api.OpStatus, Network: conf.Name}
	if pool.HasPodCIDR(conf.IPAM.ranges) {
		req.Ranges = conf.IPAM.ranges // the agent tells whether the node has its podCIDR yet
	}
	_, err := p.call(conf, req)
	if err == nil {
		return nil
	}
	if errors.Is(err, api.ErrUnreachable) {
		// The runtime's NetworkReady message and so the Node's: one line, the
		// socket named once, the cause from the dial.
		cause := err.Error()
		if op := (*net.OpError)(nil); errors.As(err, &op) {
			cause = op.Err.Error()
		}
		return cniplugin.NewError(cniplugin.ErrPluginNotAvailable,
			fmt.Sprintf("ipledgerd is not reachable on %s: %s (is ipledgerd running on this node?)", conf.IPAM.Socket, cause), "")
	}
	var ae *api.Error
	if errors.As(err, &ae) && (ae.Code == api.CodeExhausted || ae.Code == api.CodeUnavailable) {
		return cniplugin.NewError(cniplugin.ErrPluginNotAvailable, ae.Msg, "")
	}
	return toCNI(err, conf.IPAM.Socket)
}

// prevResultIPs reads the addresses of a CHECK's prevResult (spec 0.4.0 and later:
// "ips", each with an "address" in CIDR form), written as the CNI library writes them
// back (the address as given, with its prefix length).
func prevResultIPs(raw json.RawMessage) ([]string, *cniplugin.Error) {
	var prev struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(raw, &prev); err != nil {
		return nil, cniplugin.NewError(cniplugin.ErrDecodingFailure, fmt.Sprintf("prevResult: %v", err), "")
	}
	ips := make([]string, 0, len(prev.IPs))
	for i, ip := range prev.IPs {
		a, n, err := net.ParseCIDR(ip.Address)
		if err != nil {
			return nil, cniplugin.NewError(cniplugin.ErrDecodingFailure, fmt.Sprintf("prevResult.ips[%d].address: %q is not an address with a prefix length (e.g. \"10.0.0.5/24\")", i, ip.Address), "")
		}
		ips = append(ips, (&net.IPNet{IP: a, Mask: n.Mask}).String())
	}
	return ips, nil
}
