// Package sqlitewal reads a SQLite write-ahead log, for tests that count
// what a request wrote: pages (frames) and transactions (commit frames).
package sqlitewal

import (
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
)

// Counts are the valid frames of a write-ahead log: those that carry the
// log header's salts (frames left over from before the log restarted do
// not).
type Counts struct {
	// Frames is the number of pages written.
	Frames int
	// Commits is the number of frames that end a transaction (their
	// commit field, the database size after the commit, is not zero):
	// each write transaction ends in exactly one.
	Commits int
}

// The WAL format's fixed sizes (https://www.sqlite.org/fileformat2.html#walformat).
const (
	headerLen      = 32
	frameHeaderLen = 24
)

// Parse counts the valid frames of the write-ahead log wal (the whole
// file's contents). A log shorter than its header has none.
func Parse(wal []byte) Counts {
	var c Counts
	frames(wal, func(h []byte) {
		c.Frames++
		if binary.BigEndian.Uint32(h[4:8]) != 0 {
			c.Commits++
		}
	})
	return c
}

// Pages returns the page number of each valid frame of wal, in the log's
// order: which pages the commits wrote.
func Pages(wal []byte) []uint32 {
	var pages []uint32
	frames(wal, func(h []byte) { pages = append(pages, binary.BigEndian.Uint32(h[0:4])) })
	return pages
}

// frames calls f with the header of each valid frame of wal.
func frames(wal []byte, f func(header []byte)) {
	if len(wal) < headerLen {
		return
	}
	be := binary.BigEndian
	pageSize := int(be.Uint32(wal[8:12]))
	if pageSize == 1 {
		pageSize = 65536
	}
	if pageSize < 512 {
		return // not a WAL header
	}
	salt1, salt2 := be.Uint32(wal[16:20]), be.Uint32(wal[20:24])
	for off := headerLen; off+frameHeaderLen+pageSize <= len(wal); off += frameHeaderLen + pageSize {
		h := wal[off : off+frameHeaderLen]
		if be.Uint32(h[8:12]) != salt1 || be.Uint32(h[12:16]) != salt2 {
			break // left over from before the log restarted
		}
		f(h)
	}
}

// Read counts the valid frames of the write-ahead log of the SQLite
// database at path (path + "-wal"). A database without a log has none.
// With wal_autocheckpoint off the log never restarts, so the difference
// between two calls is what the commits in between wrote.
func Read(path string) (Counts, error) {
	wal, err := os.ReadFile(path + "-wal")
	if errors.Is(err, fs.ErrNotExist) {
		return Counts{}, nil
	}
	if err != nil {
		return Counts{}, err
	}
	return Parse(wal), nil
}

// ReadPages returns the page numbers of the valid frames of the
// write-ahead log of the SQLite database at path (see Pages).
func ReadPages(path string) ([]uint32, error) {
	wal, err := os.ReadFile(path + "-wal")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return Pages(wal), nil
}
