package ipam

import (
	"encoding/json"

	"github.com/ipledger/ipledger/internal/jsonlite"
)

// The plugin decodes its network configuration on every CNI call, in a new process:
// json.Unmarshal into NetConf built encoding/json's reflection cache for NetConf,
// types.NetConf and their field types each time (about 0.1 ms of a cold process, the
// largest piece of the plugin's own work left after the api messages went by hand).
// decodeNetConf reads the common shape by hand (jsonlite) and leaves every other
// config to json.Unmarshal, so the result is always what json.Unmarshal gives;
// TestDecodeNetConfMatchesJSON checks that.

// netConfFields are the JSON names of NetConf's fields, embedded ones included;
// ipamFields those of Config.
var (
	netConfFields = []string{"cniVersion", "name", "type", "capabilities", "ipam", "dns", "prevResult", "cni.dev/valid-attachments", "cni.dev/attachments"}
	ipamFields    = []string{"type", "socket", "spoolDir", "timeout", "ranges", "routes", "dataDir", "blockSize", "exclude"}
)

// decodeNetConf is json.Unmarshal(stdin, conf).
func decodeNetConf(stdin []byte, conf *NetConf) error {
	var c NetConf
	if json.Valid(stdin) {
		if d := jsonlite.NewDecoder(stdin); fastNetConf(d, &c) && d.End() {
			*conf = c
			return nil
		}
	}
	return json.Unmarshal(stdin, conf)
}

// fastNetConf reads cniVersion, name, type and an ipam section without routes; any
// other field of NetConf, or a key encoding/json would take for one, is refused.
func fastNetConf(d *jsonlite.Decoder, c *NetConf) bool {
	return d.Object(func(k string) bool {
		switch k {
		case "cniVersion":
			return d.SetStr(&c.CNIVersion)
		case "name":
			return d.SetStr(&c.Name)
		case "type":
			return d.SetStr(&c.Type)
		case "ipam":
			return d.Object(func(k string) bool {
				switch k {
				case "type":
					return d.SetStr(&c.IPAM.Type)
				case "socket":
					return d.SetStr(&c.IPAM.Socket)
				case "spoolDir":
					return d.SetStr(&c.IPAM.SpoolDir)
				case "timeout":
					return d.SetStr(&c.IPAM.Timeout)
				case "dataDir":
					return d.SetStr(&c.IPAM.DataDir)
				case "blockSize":
					var ok bool
					c.IPAM.BlockSize, ok = d.Int()
					return ok
				case "exclude":
					var ok bool
					c.IPAM.Exclude, ok = d.Strings()
					return ok
				case "ranges":
					raw, ok := d.Skip()
					c.IPAM.Ranges = append(json.RawMessage(nil), raw...)
					return ok
				}
				if !jsonlite.Skippable(k, ipamFields...) {
					return false
				}
				_, ok := d.Skip()
				return ok
			})
		}
		if !jsonlite.Skippable(k, netConfFields...) {
			return false
		}
		_, ok := d.Skip()
		return ok
	})
}
