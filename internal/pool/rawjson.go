package pool

import (
	"encoding/json"
	"net/netip"

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

// AppendRangeSets writes sets as json.Marshal does (for the callers that write
// messages and records by hand with jsonlite).
func AppendRangeSets(e *jsonlite.Encoder, sets []RangeSet) {
	e.Raw("[")
	for i, set := range sets {
		if i > 0 {
			e.Raw(",")
		}
		if set == nil {
			e.Raw("null")
			continue
		}
		e.Raw("[")
		for j, r := range set {
			if j > 0 {
				e.Raw(",")
			}
			first := true
			e.Raw("{")
			e.Field(&first, "subnet")
			e.Text(r.Subnet)
			for _, a := range []struct {
				name string
				v    netip.Addr
			}{{"rangeStart", r.RangeStart}, {"rangeEnd", r.RangeEnd}, {"gateway", r.Gateway}} {
				if a.v != (netip.Addr{}) {
					e.Field(&first, a.name)
					e.Text(a.v)
				}
			}
			if r.PodCIDR != 0 { // in json.Marshal's order, after the struct's other fields
				e.Field(&first, "usePodCidr")
				e.Int(int64(r.PodCIDR))
			}
			e.Raw("}")
		}
		e.Raw("]")
	}
	e.Raw("]")
}
