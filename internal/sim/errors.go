package sim

import "errors"

// errExhausted marks an ADD refused because the pool has no free address.
var errExhausted = errors.New("pool exhausted")

// errChained is the failing chained plugin of seed 001.
var errChained = errors.New("chained plugin failed")

// errRuntimeDown is what the modelled runtime answers while it restarts.
var errRuntimeDown = errors.New("runtime restarting: connection refused")
