package boltstore_test

import (
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
)

var _ ledger.Store

func poolRanges() ([]pool.RangeSet, error) {
	return pool.ParseRangeSets([]byte(`[[{"subnet":"10.20.0.0/16"}]]`))
}
