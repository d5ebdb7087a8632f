// Package store holds the key layout shared by the ledger's store implementations
// (memstore for unit tests, boltstore on disk): byte keys that sort the way the ledger
// iterates.
package store

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/ipledger/ipledger/internal/ledger"
)

// LeaseKey is network NUL containerID NUL ifname.
func LeaseKey(k ledger.Key) []byte {
	b := make([]byte, 0, len(k.Network)+len(k.ContainerID)+len(k.IfName)+2)
	b = append(b, k.Network...)
	b = append(b, 0)
	b = append(b, k.ContainerID...)
	b = append(b, 0)
	return append(b, k.IfName...)
}

// AddrKey is network NUL the 16-byte address.
func AddrKey(network string, ip netip.Addr) []byte {
	a := ip.As16()
	b := make([]byte, 0, len(network)+17)
	b = append(b, network...)
	b = append(b, 0)
	return append(b, a[:]...)
}

// BlockKey is AddrKey of the block's first address followed by its prefix length.
func BlockKey(network string, p netip.Prefix) []byte {
	return append(AddrKey(network, p.Addr()), byte(p.Bits()))
}

// HistoryKey is AddrKey followed by the big-endian release sequence, so one address's
// releases are adjacent and in order.
func HistoryKey(network string, ip netip.Addr, seq uint64) []byte {
	b := AddrKey(network, ip)
	return binary.BigEndian.AppendUint64(b, seq)
}

// HistorySeqLen is the length of the release sequence that ends every HistoryKey: a
// uint64, written big-endian in full so that keys compare in sequence order. A history
// key without its last HistorySeqLen bytes is the AddrKey of its address.
const HistorySeqLen = 8

// HistoryPrefixLen is the length of the AddrKey part of a HistoryKey of network.
func HistoryPrefixLen(network string) int { return len(network) + 17 }

// MaxRecord is the largest record (JSON value) a store accepts. The ledger bounds
// every field of a request so that its records stay far below it.
const MaxRecord = 64 << 10

// CheckSize refuses values larger than max with a clear error.
func CheckSize(what string, n, max int) error {
	if n > max {
		return fmt.Errorf("%s record is %d bytes, more than the limit of %d", what, n, max)
	}
	return nil
}
