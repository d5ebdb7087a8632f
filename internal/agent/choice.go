package agent

import (
	"fmt"
	"net/netip"

	"github.com/ipledger/ipledger/internal/api"
)

// WhyDefault is the reason recorded with a lease whose addresses came from the
// network's own ranges, as no annotation chose otherwise.
const WhyDefault = "default pool"

// excludeOf reads an ADD's ipam.exclude (the plugin checked it; a request from
// elsewhere is checked again).
func excludeOf(ex []string) ([]netip.Prefix, *api.Error) {
	if len(ex) > api.MaxExclude {
		return nil, &api.Error{Code: api.CodeInvalid, Msg: fmt.Sprintf("ipam.exclude: %d entries; at most %d", len(ex), api.MaxExclude)}
	}
	var out []netip.Prefix
	for i, s := range ex {
		p, err := api.ParseExclude(s)
		if err != nil {
			return nil, &api.Error{Code: api.CodeInvalid, Msg: fmt.Sprintf("ipam.exclude[%d]: %v", i, err)}
		}
		out = append(out, p)
	}
	return out, nil
}
