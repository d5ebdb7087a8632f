package walstore

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The buckets of the bbolt file, in the order a log record numbers them. Their names
// are boltstore's (the file's format).
const (
	bPools = iota
	bLeases
	bFree
	bHistory
	bBlocks // the numbers are stored in log records: a new bucket takes the next one
	numBuckets
)

var bucketNames = [numBuckets][]byte{[]byte("pools"), []byte("leases"), []byte("free"), []byte("history"), []byte("blocks")}

// op is one change of one key: a put of val, or a delete.
type op struct {
	bucket uint8
	del    bool
	key    string
	val    []byte
}

const (
	opPut = 1
	opDel = 2
)

// encodeOps is a record's payload: for each op its kind, bucket, key and (for a put)
// value, lengths as uvarints.
func encodeOps(dst []byte, ops []op) []byte {
	for _, o := range ops {
		kind := byte(opPut)
		if o.del {
			kind = opDel
		}
		dst = append(dst, kind, o.bucket)
		dst = binary.AppendUvarint(dst, uint64(len(o.key)))
		dst = append(dst, o.key...)
		if !o.del {
			dst = binary.AppendUvarint(dst, uint64(len(o.val)))
			dst = append(dst, o.val...)
		}
	}
	return dst
}

var errBadOps = errors.New("malformed operations")

// decodeOps reads a payload back. The record's checksum held, so an error here is a
// record this code did not write.
func decodeOps(p []byte) ([]op, error) {
	var ops []op
	for len(p) > 0 {
		if len(p) < 2 || (p[0] != opPut && p[0] != opDel) || p[1] >= numBuckets {
			return nil, errBadOps
		}
		o := op{bucket: p[1], del: p[0] == opDel}
		p = p[2:]
		k, n := binary.Uvarint(p)
		if n <= 0 || k > uint64(len(p)-n) {
			return nil, errBadOps
		}
		o.key = string(p[n : n+int(k)])
		p = p[n+int(k):]
		if !o.del {
			v, n := binary.Uvarint(p)
			if n <= 0 || v > uint64(len(p)-n) {
				return nil, errBadOps
			}
			o.val = append([]byte(nil), p[n:n+int(v)]...)
			p = p[n+int(v):]
		}
		ops = append(ops, o)
	}
	if len(ops) == 0 {
		return nil, fmt.Errorf("%w: empty record", errBadOps)
	}
	return ops, nil
}
