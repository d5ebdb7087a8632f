package walstore

// The log is written by hand, not taken from a library: the candidates were read for
// their durability and none fits. hashicorp/raft-wal calls os.File.Sync (fsync, which
// on ext4 commits the journal for the mtime change of every append, the metadata flush
// this package exists to avoid), keeps its own segment metadata in a second bbolt file
// (two more fsyncs per rotation), brings hashicorp/raft, and calls itself experimental.
// tidwall/wal frames records as a length and the bytes, with no checksum, so a torn
// tail cannot be told from data, and it also syncs with fsync. etcd's wal (fdatasync,
// CRC chain, preallocation) is sound but is built around raft's records, snapshots and
// hard state and brings the etcd server module into the agent. What is needed here is
// small: two files of checksummed, numbered records, appended and fdatasync'd, read
// back once at start.
//
// Layout of one record, 8-byte aligned (integers little-endian):
//
//	magic  uint32  "IPLW"
//	length uint32  payload bytes
//	index  uint64  position in the log: 1, 2, 3 ... across files and restarts
//	logID  uint64  the ledger file's log identity (meta key walID in ledger.db)
//	crc    uint32  CRC-32C of length, index, logID and the payload
//	zero   uint32
//	payload, then zero bytes up to the next multiple of 8
//
// Files grow in zero-filled chunks (not fallocate: writing into unwritten extents is
// itself a metadata change that fdatasync must journal), and are written over in
// place when a segment is used again, so that an append's fdatasync flushes the data
// alone, except once per chunk.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/ipledger/ipledger/internal/ledger"
)

const (
	recMagic   = 0x574c5049 // "IPLW" read little-endian
	headerSize = 32
	recAlign   = 8
	growChunk  = 64 << 10
	// maxPayload bounds one record (one transaction): far above what a group commit
	// writes (records of at most 64 KiB each), far below what would exhaust memory on
	// a garbage length.
	maxPayload = 256 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var zeros = make([]byte, growChunk)

// errSyncFailed marks a failed fdatasync: what reached the disk is unknown.
var errSyncFailed = errors.New("fdatasync failed")

// segment is one log file.
type segment struct {
	path string
	f    *os.File
	size int64 // file size: bytes zero-filled or written
	off  int64 // where the next record goes
}

// encodeRecord returns the record of payload with its header and padding.
func encodeRecord(dst []byte, index, logID uint64, payload []byte) []byte {
	n := headerSize + len(payload)
	pad := (recAlign - n%recAlign) % recAlign
	start := len(dst)
	dst = append(dst, make([]byte, headerSize)...)
	h := dst[start:]
	binary.LittleEndian.PutUint32(h[0:], recMagic)
	binary.LittleEndian.PutUint32(h[4:], uint32(len(payload)))
	binary.LittleEndian.PutUint64(h[8:], index)
	binary.LittleEndian.PutUint64(h[16:], logID)
	crc := crc32.Update(0, castagnoli, h[4:24])
	crc = crc32.Update(crc, castagnoli, payload)
	binary.LittleEndian.PutUint32(h[24:], crc)
	dst = append(dst, payload...)
	return append(dst, zeros[:pad]...)
}

// parseRecord reads the record at data[pos:]: its index, payload and length with
// padding. ok is false when no whole, intact record of logID starts there.
func parseRecord(data []byte, pos int, logID uint64) (index uint64, payload []byte, n int, ok bool) {
	if pos < 0 || pos+headerSize > len(data) {
		return 0, nil, 0, false
	}
	h := data[pos : pos+headerSize]
	if binary.LittleEndian.Uint32(h[0:]) != recMagic || binary.LittleEndian.Uint64(h[16:]) != logID || binary.LittleEndian.Uint32(h[28:]) != 0 {
		return 0, nil, 0, false
	}
	length := int(binary.LittleEndian.Uint32(h[4:]))
	if length > maxPayload || pos+headerSize+length > len(data) {
		return 0, nil, 0, false
	}
	payload = data[pos+headerSize : pos+headerSize+length]
	crc := crc32.Update(0, castagnoli, h[4:24])
	crc = crc32.Update(crc, castagnoli, payload)
	if crc != binary.LittleEndian.Uint32(h[24:]) {
		return 0, nil, 0, false
	}
	n = headerSize + length
	n += (recAlign - n%recAlign) % recAlign
	return binary.LittleEndian.Uint64(h[8:]), payload, n, true
}

// scanned is one intact record read back from a segment.
type scanned struct {
	index   uint64
	payload []byte
}

// scanSegment reads the run of intact records with consecutive indexes from the start
// of data; the run ends at the first torn or foreign record, at zeros, or at a record
// left from an earlier use of the file (its index is lower). Every record written
// after another was written after that one was fdatasync'd, so only the last record
// written can be torn; an intact record of this log beyond the run with an index
// above applied is one written after a damaged one: corruption in the middle, not a
// torn tail. end is where the run stops.
func scanSegment(path string, data []byte, logID, applied uint64) (run []scanned, end int, err error) {
	pos := 0
	for {
		idx, payload, n, ok := parseRecord(data, pos, logID)
		if !ok || (len(run) > 0 && idx != run[len(run)-1].index+1) {
			break
		}
		run = append(run, scanned{idx, payload})
		pos += n
	}
	end = pos
	for p := end; p+headerSize <= len(data); p += recAlign {
		if idx, _, _, ok := parseRecord(data, p, logID); ok && idx > applied {
			return nil, 0, corruptLog(path, fmt.Errorf("the record at byte %d cannot be read but record %d after it (byte %d) can: the file is damaged, not cut short by a crash", end, idx, p))
		}
	}
	return run, end, nil
}

// openSegment opens (creating) a log file and reads it whole.
func openSegment(path string) (*segment, []byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: write-ahead log %s: %v", ledger.ErrStore, path, err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%w: write-ahead log %s: %v", ledger.ErrStore, path, err)
	}
	return &segment{path: path, f: f, size: int64(len(data))}, data, nil
}

// append writes rec at the segment's offset and fdatasyncs it. When the file must
// grow, it grows first by zero-filled chunks; a failure there (a full disk) leaves
// nothing of rec written. A failed write leaves at most an unsynced part of rec past
// the offset, which the next append writes over and recovery reads as a torn tail. A
// failed fdatasync is reported wrapping errSyncFailed.
func (sg *segment) append(rec []byte) error {
	need := sg.off + int64(len(rec))
	for sg.size < need {
		w, err := sg.f.WriteAt(zeros, sg.size)
		sg.size += int64(w)
		if err != nil {
			return err
		}
	}
	if _, err := sg.f.WriteAt(rec, sg.off); err != nil {
		return err
	}
	at("written")
	if err := fdatasync(sg.f); err != nil {
		return fmt.Errorf("%w: %w", errSyncFailed, err)
	}
	sg.off = need
	return nil
}

// truncate empties the file, durably.
func (sg *segment) truncate() error {
	if err := sg.f.Truncate(0); err != nil {
		return err
	}
	if err := sg.f.Sync(); err != nil {
		return err
	}
	sg.size, sg.off = 0, 0
	return nil
}

// syncHook, when set (by tests), replaces the log's fdatasync.
var syncHook func(f *os.File) error

func fdatasync(f *os.File) error {
	if syncHook != nil {
		return syncHook(f)
	}
	return fdatasyncFile(f)
}

func fdatasyncFile(f *os.File) error {
	for {
		err := unix.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}

// syncDir makes the creation of files in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
