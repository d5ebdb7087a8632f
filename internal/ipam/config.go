// Package ipam is the logic of the `ipledger` CNI IPAM plugin: a thin client that
// turns each CNI call into one request to the node agent. Its main is one
// cniplugin.Main call. The agent runs the same verbs for a main plugin that hands an
// ipledger IPAM call over instead of exec'ing this plugin (Forward).
package ipam

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cniplugin"
	"github.com/ipledger/ipledger/internal/jsonlite"
	"github.com/ipledger/ipledger/internal/pool"
)

// Defaults shared with ipledgerd.
const (
	DefaultSocket  = "/run/ipledger/ipledger.sock"
	DefaultTimeout = 10 * time.Second
)

// NetConf is the network configuration the plugin reads from stdin: the spec's
// fields an IPAM plugin reads, and its ipam section.
type NetConf struct {
	CNIVersion       string           `json:"cniVersion,omitempty"`
	Name             string           `json:"name,omitempty"`
	Type             string           `json:"type,omitempty"`
	Capabilities     map[string]bool  `json:"capabilities,omitempty"`
	DNS              cniplugin.DNS    `json:"dns,omitempty"`
	RawPrevResult    json.RawMessage  `json:"prevResult,omitempty"`
	IPAM             Config           `json:"ipam"`
	ValidAttachments []api.Attachment `json:"cni.dev/valid-attachments,omitempty"`
	Attachments      []api.Attachment `json:"cni.dev/attachments,omitempty"`
}

// Config is the plugin's `ipam` section, host-local compatible where it overlaps.
//
// There is no spool setting: the plugin spools a DEL only where the agent serving
// Socket published its spool (spool.Resolve), so the two cannot drift apart. The
// field spoolDir of earlier releases is accepted and ignored.
type Config struct {
	Type     string             `json:"type"`
	Socket   string             `json:"socket,omitempty"`
	SpoolDir string             `json:"spoolDir,omitempty"` // deprecated, ignored
	Timeout  string             `json:"timeout,omitempty"`
	Ranges   json.RawMessage    `json:"ranges,omitempty"`
	Routes   []*cniplugin.Route `json:"routes,omitempty"`
	DataDir  string             `json:"dataDir,omitempty"` // host-local's; accepted and ignored
	// BlockSize is cluster mode's block prefix length (0: /26 for IPv4, /122 for
	// IPv6); the agent checks it against the ranges. Node mode ignores it.
	BlockSize int `json:"blockSize,omitempty"`
	// Exclude are addresses and CIDRs no pod gets ("10.0.0.5", "10.0.0.16/28"): the
	// node-mode form of a reservation. A lease already holding one keeps it.
	Exclude []string `json:"exclude,omitempty"`

	ranges  []pool.RangeSet
	timeout time.Duration
}

// rawNetConf decodes routes leniently so that a bad route names its field.
type rawRoute struct {
	Dst string `json:"dst"`
	GW  string `json:"gw,omitempty"`
}

// ParseConfig decodes and validates stdin. needRanges is false for DEL, GC and STATUS,
// which must work even when the ranges are not given.
func ParseConfig(stdin []byte, needRanges bool) (*NetConf, *cniplugin.Error) {
	var conf NetConf
	if err := decodeNetConf(stdin, &conf); err != nil { // json.Unmarshal, by hand for the common shape
		var probe struct {
			IPAM struct {
				Routes []rawRoute `json:"routes"`
			} `json:"ipam"`
		}
		if json.Unmarshal(stdin, &probe) == nil {
			for i, r := range probe.IPAM.Routes {
				if _, _, perr := net.ParseCIDR(r.Dst); perr != nil {
					return nil, cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, fmt.Sprintf("ipam.routes[%d].dst: %q is not a CIDR (want e.g. \"0.0.0.0/0\")", i, r.Dst), "")
				}
				if r.GW != "" && net.ParseIP(r.GW) == nil {
					return nil, cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, fmt.Sprintf("ipam.routes[%d].gw: %q is not an IP address", i, r.GW), "")
				}
			}
		}
		return nil, cniplugin.NewError(cniplugin.ErrDecodingFailure, fmt.Sprintf("network configuration is not valid JSON of the expected shape: %v", err), "")
	}
	if conf.Name == "" {
		return nil, cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, "name: missing; the network name identifies the pool", "")
	}
	if err := (api.Key{Network: conf.Name, ContainerID: "x", IfName: "x"}).Validate(); err != nil {
		return nil, cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, fmt.Sprintf("name: %v", err), "")
	}
	c := &conf.IPAM
	if c.Socket == "" {
		c.Socket = DefaultSocket
	}
	c.timeout = DefaultTimeout
	if c.Timeout != "" {
		d, err := time.ParseDuration(c.Timeout)
		if err != nil || d <= 0 {
			return nil, cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, fmt.Sprintf("ipam.timeout: %q is not a positive duration (e.g. \"10s\")", c.Timeout), "")
		}
		c.timeout = d
	}
	if len(c.Ranges) > 0 && string(c.Ranges) != "null" {
		if needRanges {
			if cerr := checkRangeCount(c.Ranges); cerr != nil {
				return nil, cerr
			}
		}
		sets, err := pool.ParseRangeSets(c.Ranges)
		if err != nil && needRanges {
			return nil, cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, "ipam."+strings.TrimPrefix(err.Error(), pool.ErrInvalidRange.Error()+": "), "")
		}
		// DEL, CHECK, GC and STATUS do not use the ranges: a broken ranges field
		// must not stop a DEL from releasing (the runtime may never retry it)
		if err == nil {
			c.ranges = sets
		}
	} else if needRanges {
		return nil, cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, "ipam.ranges: missing; give e.g. [[{\"subnet\": \"10.0.0.0/24\"}]]", "")
	}
	if c.BlockSize < 0 || c.BlockSize > 128 {
		return nil, cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, fmt.Sprintf("ipam.blockSize: %d is not a prefix length; give e.g. 26 (IPv4 /26 blocks, IPv6 /122) or leave it out", c.BlockSize), "")
	}
	if needRanges {
		if cerr := checkExclude(c.Exclude); cerr != nil {
			return nil, cerr
		}
	}
	for i, r := range c.Routes {
		if r == nil || r.Dst.IP == nil {
			return nil, cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, fmt.Sprintf("ipam.routes[%d].dst: missing", i), "")
		}
	}
	return &conf, nil
}

// checkExclude refuses an ipam.exclude entry that is not an address or a CIDR
// without host bits, naming the entry and the fix.
func checkExclude(ex []string) *cniplugin.Error {
	if len(ex) > api.MaxExclude {
		return cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, fmt.Sprintf("ipam.exclude: %d entries; at most %d (use CIDRs for ranges)", len(ex), api.MaxExclude), "")
	}
	for i, e := range ex {
		if _, err := api.ParseExclude(e); err != nil {
			return cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, fmt.Sprintf("ipam.exclude[%d]: %v", i, err), "")
		}
	}
	return nil
}

// Limits on the pod identity values taken from CNI_ARGS.
const maxArgValue = 512

// PodArgs parses CNI_ARGS ("K=V;K=V"): the pod's namespace, name and UID. Unknown keys
// are ignored (the runtime sends IgnoreUnknown); malformed pairs or values are errors
// naming CNI_ARGS.
func PodArgs(s string) (api.Pod, *cniplugin.Error) {
	var pod api.Pod
	if s == "" {
		return pod, nil
	}
	if len(s) > 16<<10 {
		return pod, cniplugin.NewError(cniplugin.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_ARGS: %d bytes; at most 16384", len(s)), "")
	}
	for i, pair := range strings.Split(s, ";") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return pod, cniplugin.NewError(cniplugin.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_ARGS: pair %d (%q) is not KEY=VALUE; the format is K1=V1;K2=V2", i, clip(pair)), "")
		}
		if len(v) > maxArgValue {
			return pod, cniplugin.NewError(cniplugin.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_ARGS: %s is %d bytes; at most %d", clip(k), len(v), maxArgValue), "")
		}
		for _, c := range []byte(v) {
			if c < ' ' || c == 0x7f {
				return pod, cniplugin.NewError(cniplugin.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_ARGS: %s holds a control character", clip(k)), "")
			}
		}
		switch k {
		case "K8S_POD_NAMESPACE":
			pod.Namespace = v
		case "K8S_POD_NAME":
			pod.Name = v
		case "K8S_POD_UID":
			pod.UID = v
		case "K8S_POD_INFRA_CONTAINER_ID":
			pod.InfraContainerID = v
		}
	}
	return pod, nil
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// checkRangeCount refuses more than api.MaxRanges ranges before they are parsed and
// checked against each other. Shapes it cannot count are left to ParseRangeSets,
// whose errors name the field.
func checkRangeCount(raw json.RawMessage) *cniplugin.Error {
	n, ok := countRanges(raw)
	if !ok { // a shape the count by hand does not read: as encoding/json counts it
		var sets [][]json.RawMessage
		if json.Unmarshal(raw, &sets) != nil {
			return nil
		}
		for _, s := range sets {
			n += len(s)
		}
	}
	if n > api.MaxRanges {
		return cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, fmt.Sprintf("ipam.ranges: %d ranges; at most %d in one network", n, api.MaxRanges), "")
	}
	return nil
}

// ParseDelConfig reads what DEL needs and nothing else: the network name (which,
// with CNI_CONTAINERID and CNI_IFNAME, identifies the attachment), the agent's socket
// and the call's timeout. DEL must release whenever it can name the attachment, so
// fields DEL does not use (ranges, routes, dns, mtu, anything a chained plugin reads)
// are not looked at, and a malformed timeout falls back to the default (noted in
// warnings, for stderr). It fails only when stdin is not a JSON object, or the name or
// the socket is missing or malformed: without them the attachment or its agent is
// unknown.
func ParseDelConfig(stdin []byte) (conf *NetConf, warnings []string, cerr *cniplugin.Error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(stdin, &top); err != nil || top == nil {
		return nil, nil, cniplugin.NewError(cniplugin.ErrDecodingFailure, fmt.Sprintf("network configuration is not a JSON object: %v", err), "")
	}
	conf = &NetConf{}
	if raw, ok := top["cniVersion"]; ok {
		json.Unmarshal(raw, &conf.CNIVersion) // Main has checked it
	}
	if err := json.Unmarshal(top["name"], &conf.Name); err != nil || conf.Name == "" {
		return nil, nil, cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, "name: missing or not a string; the network name identifies the attachment", "")
	}
	if err := (api.Key{Network: conf.Name, ContainerID: "x", IfName: "x"}).Validate(); err != nil {
		return nil, nil, cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, fmt.Sprintf("name: %v", err), "")
	}
	c := &conf.IPAM
	c.Socket, c.timeout = DefaultSocket, DefaultTimeout
	var ipam map[string]json.RawMessage
	if raw, ok := top["ipam"]; ok {
		if err := json.Unmarshal(raw, &ipam); err != nil {
			return nil, nil, cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, "ipam: not an object; DEL needs ipam.socket from it", "")
		}
	}
	if raw, ok := ipam["socket"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &c.Socket); err != nil || c.Socket == "" {
			return nil, nil, cniplugin.NewError(cniplugin.ErrInvalidNetworkConfig, "ipam.socket: not a path; DEL needs it to reach ipledgerd", "")
		}
	}
	if raw, ok := ipam["timeout"]; ok && string(raw) != "null" {
		var ts string
		d, err := time.Duration(0), json.Unmarshal(raw, &ts)
		if err == nil {
			d, err = time.ParseDuration(ts)
		}
		if err != nil || d <= 0 {
			warnings = append(warnings, fmt.Sprintf("ipam.timeout: %s is not a positive duration; DEL uses %v", raw, DefaultTimeout))
		} else {
			c.timeout = d
		}
	}
	return conf, warnings, nil
}

// countRanges counts the ranges of a [[range, ...], ...] array without decoding
// them; ok is false for any other shape. (By hand: json.Unmarshal into
// [][]json.RawMessage built its reflection cache in every plugin process.)
func countRanges(raw json.RawMessage) (n int, ok bool) {
	if !json.Valid(raw) {
		return 0, false
	}
	d := jsonlite.NewDecoder(raw)
	ok = d.Array(func() bool {
		return d.Array(func() bool {
			n++
			_, ok := d.Skip()
			return ok
		})
	}) && d.End()
	return n, ok
}
