package pool

import (
	"encoding/json"

	"github.com/ipledger/ipledger/internal/jsonlite"
)

// decodeRaw is json.Unmarshal(data, &raw) for the ranges field, read by hand
// (jsonlite) for the common shape: the plugin parses its ranges on every ADD, in a new
// process, where encoding/json's reflection cache for rawRange cost about 25 µs.
// Anything outside jsonlite's subset is left to json.Unmarshal; TestDecodeRawMatchesJSON
// compares the two.
func decodeRaw(data []byte) ([][]rawRange, error) {
	if json.Valid(data) {
		var raw [][]rawRange
		d := jsonlite.NewDecoder(data)
		ok := d.Array(func() bool {
			set := []rawRange{}
			ok := d.Array(func() bool {
				var r rawRange
				ok := d.Object(func(k string) bool {
					switch k {
					case "subnet":
						return d.SetStr(&r.Subnet)
					case "rangeStart":
						return d.SetStr(&r.RangeStart)
					case "rangeEnd":
						return d.SetStr(&r.RangeEnd)
					case "gateway":
						return d.SetStr(&r.Gateway)
					}
					if !jsonlite.Skippable(k, "subnet", "rangeStart", "rangeEnd", "gateway") {
						return false
					}
					_, ok := d.Skip()
					return ok
				})
				set = append(set, r)
				return ok
			})
			raw = append(raw, set)
			return ok
		})
		if ok && d.End() {
			if raw == nil {
				raw = [][]rawRange{}
			}
			return raw, nil
		}
	}
	var raw [][]rawRange
	err := json.Unmarshal(data, &raw)
	return raw, err
}
