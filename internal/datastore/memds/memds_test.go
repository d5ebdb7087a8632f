package memds_test

import (
	"time"

	"testing"

	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/datastore/datastoretest"
	"github.com/ipledger/ipledger/internal/datastore/memds"
)

func TestConformance(t *testing.T) {
	shared := memds.New(clock.NewSystem())
	datastoretest.Run(t, func(t *testing.T) datastore.Store { return shared.Open() }, datastoretest.Options{
		Compact: func(t *testing.T, rev int64) { shared.Compact(rev) },
		Stop: func(t *testing.T) func() {
			shared.SetAvailable(false)
			return func() { shared.SetAvailable(true) }
		},
		LeaseTTL: time.Second,
	})
}
