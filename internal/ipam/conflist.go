package ipam

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ipledger/ipledger/internal/pool"
)

// ErrNoIPAM: a conflist names no plugin whose ipam type is "ipledger".
var ErrNoIPAM = errors.New(`no plugin with "ipam": {"type": "ipledger"}`)

// FromConflist reads the ipam config a runtime would hand this plugin from a CNI
// network config list: the first plugin whose ipam type is "ipledger", given the
// list's name and cniVersion as libcni gives them, parsed and checked as an ADD's
// config is. Errors name the field.
func FromConflist(b []byte) (*NetConf, error) {
	var list struct {
		CNIVersion string            `json:"cniVersion"`
		Name       string            `json:"name"`
		Plugins    []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, fmt.Errorf("not a network config list (JSON with name and plugins): %v", err)
	}
	for i, raw := range list.Plugins {
		var probe struct {
			IPAM struct {
				Type string `json:"type"`
			} `json:"ipam"`
		}
		if err := json.Unmarshal(raw, &probe); err != nil {
			return nil, fmt.Errorf("plugins[%d]: %v", i, err)
		}
		if probe.IPAM.Type != "ipledger" {
			continue
		}
		// what libcni does for each plugin of a list: the list's name and
		// cniVersion are the plugin's
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("plugins[%d]: %v", i, err)
		}
		m["name"], _ = json.Marshal(list.Name)
		m["cniVersion"], _ = json.Marshal(list.CNIVersion)
		conf, _ := json.Marshal(m)
		nc, cerr := ParseConfig(conf, true)
		if cerr != nil {
			return nil, fmt.Errorf("plugins[%d]: %s", i, cerr.Error())
		}
		return nc, nil
	}
	return nil, ErrNoIPAM
}

// RangeSets are the parsed ranges (nil before ParseConfig, or when a DEL's config
// gave none that parse).
func (c *Config) RangeSets() []pool.RangeSet { return c.ranges }
