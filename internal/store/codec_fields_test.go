package store

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/ipledger/ipledger/internal/jsonlite/fieldtest"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
)

// Every field of every record, including ones added to the ledger's types after the
// hand-written codec, is written exactly as json.Marshal writes it and read back as
// json.Unmarshal reads it: a forgotten field fails here instead of vanishing from disk.
func TestRecordCodecEveryField(t *testing.T) {
	ranges := []pool.RangeSet{{{Subnet: netip.MustParsePrefix("10.1.2.0/24"), Gateway: netip.MustParseAddr("10.1.2.1")}}}
	var lease ledger.Lease
	fieldtest.Fill(t, reflect.ValueOf(&lease))
	checkRecord(t, lease)
	var free ledger.Free
	fieldtest.Fill(t, reflect.ValueOf(&free))
	checkRecord(t, free)
	var rel ledger.Release
	fieldtest.Fill(t, reflect.ValueOf(&rel))
	checkRecord(t, rel)
	var p ledger.PoolRecord
	fieldtest.Fill(t, reflect.ValueOf(&p))
	p.Ranges = ranges
	checkRecord(t, p)
	var b ledger.BlockRecord
	fieldtest.Fill(t, reflect.ValueOf(&b))
	checkRecord(t, b)
}
