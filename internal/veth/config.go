package veth

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
)

const (
	// DefaultMTU is the MTU of both veth ends when neither the config nor the
	// host's default route gives one (see uplinkMTU).
	DefaultMTU = 1500
	// DefaultHostVethPrefix is the host-side name prefix when the config has none.
	DefaultHostVethPrefix = "ipl"
	// maxPrefixLen leaves at least 8 hex digits of hash in a 15-character name.
	maxPrefixLen = 7
	// maxIfNameLen is IFNAMSIZ-1.
	maxIfNameLen = 15
	// aliasTag starts every host-side veth alias we write; an interface without it
	// is never ours.
	aliasTag = "ipledger-veth"
	// maxAliasLen is IFALIASZ-1.
	maxAliasLen = 255
)

var prefixRE = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9_-]*$`)

// NetConf is the plugin's network configuration: the standard CNI fields (with
// the ipam section) plus mtu and hostVethPrefix.
type NetConf struct {
	types.NetConf
	// MTU of both veth ends; 0 (no mtu in the config) means the MTU of the
	// interface of the host's default route, found at ADD (uplinkMTU).
	MTU            int    `json:"mtu,omitempty"`
	HostVethPrefix string `json:"hostVethPrefix,omitempty"`
	// Attachments is GC's list under the spec's older key; cni.dev/valid-attachments
	// (in types.NetConf) wins when both are present.
	Attachments []types.GCAttachment `json:"cni.dev/attachments,omitempty"`
}

// ParseConfig decodes stdin, applies defaults and validates the plugin fields.
// An absent mtu stays 0: only ADD, in the host namespace, can look it up.
func ParseConfig(stdin []byte) (*NetConf, error) {
	conf := &NetConf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, fmt.Errorf("%w: decode: %v", ErrConfig, err)
	}
	if conf.MTU != 0 && (conf.MTU < 68 || conf.MTU > 65535) {
		return nil, fmt.Errorf("%w: mtu %d out of range 68..65535", ErrConfig, conf.MTU)
	}
	if conf.HostVethPrefix == "" {
		conf.HostVethPrefix = DefaultHostVethPrefix
	}
	if len(conf.HostVethPrefix) > maxPrefixLen || !prefixRE.MatchString(conf.HostVethPrefix) {
		return nil, fmt.Errorf("%w: hostVethPrefix %q must be 1..%d characters [a-zA-Z0-9_-] starting with a letter",
			ErrConfig, conf.HostVethPrefix, maxPrefixLen)
	}
	if conf.Name == "" || strings.ContainsAny(conf.Name, " \t\n=") {
		return nil, fmt.Errorf("%w: network name %q must be non-empty without blanks or '='", ErrConfig, conf.Name)
	}
	if conf.IPAM.Type == "" {
		return nil, fmt.Errorf("%w: ipam.type is required", ErrConfig)
	}
	return conf, nil
}

// ParseDelConfig reads what DEL needs and nothing else: the network name and the
// ipam type (which together with CNI_CONTAINERID and CNI_IFNAME name the attachment),
// and hostVethPrefix when it is valid. DEL must succeed whenever it can identify the
// attachment, so fields DEL does not use (mtu, dns, routes, ...) are not decoded at
// all, and a bad hostVethPrefix falls back to the default: findAttachmentLink then
// finds the veth by the attachment recorded in its alias. warnings say what was set
// aside, for stderr.
func ParseDelConfig(stdin []byte) (conf *NetConf, warnings []string, err error) {
	var raw struct {
		Name           string          `json:"name"`
		HostVethPrefix json.RawMessage `json:"hostVethPrefix"`
		IPAM           struct {
			Type string `json:"type"`
		} `json:"ipam"`
	}
	if err := json.Unmarshal(stdin, &raw); err != nil {
		return nil, nil, fmt.Errorf("%w: decode: %v (DEL needs name and ipam.type)", ErrConfig, err)
	}
	conf = &NetConf{HostVethPrefix: DefaultHostVethPrefix}
	conf.Name, conf.IPAM.Type = raw.Name, raw.IPAM.Type
	if conf.Name == "" || strings.ContainsAny(conf.Name, " \t\n=") {
		return nil, nil, fmt.Errorf("%w: network name %q must be non-empty without blanks or '='", ErrConfig, conf.Name)
	}
	if conf.IPAM.Type == "" {
		return nil, nil, fmt.Errorf("%w: ipam.type is required", ErrConfig)
	}
	if len(raw.HostVethPrefix) > 0 && string(raw.HostVethPrefix) != "null" {
		var prefix string
		if json.Unmarshal(raw.HostVethPrefix, &prefix) == nil && prefix != "" && len(prefix) <= maxPrefixLen && prefixRE.MatchString(prefix) {
			conf.HostVethPrefix = prefix
		} else {
			warnings = append(warnings, fmt.Sprintf("hostVethPrefix %s is not valid; DEL looks the veth up by its recorded attachment", raw.HostVethPrefix))
		}
	}
	return conf, warnings, nil
}

// HostVethName is the deterministic host-side veth name of an attachment:
// prefix + the first hex digits of sha256(network NUL containerID NUL ifname),
// filling the name to 15 characters.
func HostVethName(prefix, network, containerID, ifName string) string {
	sum := sha256.Sum256([]byte(network + "\x00" + containerID + "\x00" + ifName))
	return prefix + hex.EncodeToString(sum[:])[:maxIfNameLen-len(prefix)]
}

// Attachment is what we record in the host-side veth's link alias:
// "ipledger-veth net=NAME cid=CONTAINERID if=IFNAME netns=DEV:INO".
type Attachment struct {
	Network     string
	ContainerID string
	IfName      string
	NetNS       NSID
}

// Alias renders the attachment as a link alias.
func (a Attachment) Alias() (string, error) {
	s := fmt.Sprintf("%s net=%s cid=%s if=%s netns=%s", aliasTag, a.Network, a.ContainerID, a.IfName, a.NetNS)
	if len(s) > maxAliasLen {
		return "", fmt.Errorf("%w: attachment record %q longer than %d bytes (network name too long?)", ErrConfig, s, maxAliasLen)
	}
	return s, nil
}

// ParseAlias parses an alias written by Alias. ok is false for any alias that is
// not ours.
func ParseAlias(alias string) (a Attachment, ok bool) {
	fields := strings.Fields(alias)
	if len(fields) != 5 || fields[0] != aliasTag {
		return Attachment{}, false
	}
	kv := map[string]string{}
	for _, f := range fields[1:] {
		k, v, found := strings.Cut(f, "=")
		if !found || v == "" {
			return Attachment{}, false
		}
		kv[k] = v
	}
	id, err := ParseNSID(kv["netns"])
	if err != nil || kv["net"] == "" || kv["cid"] == "" || kv["if"] == "" {
		return Attachment{}, false
	}
	return Attachment{Network: kv["net"], ContainerID: kv["cid"], IfName: kv["if"], NetNS: id}, true
}

// Matches reports whether a is the attachment (network, containerID, ifname).
func (a Attachment) Matches(network, containerID, ifName string) bool {
	return a.Network == network && a.ContainerID == containerID && a.IfName == ifName
}
