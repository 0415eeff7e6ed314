package console

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"

	lru "github.com/hashicorp/golang-lru/v2"
)

// RecordID returns the console's name for the record at (scope, key): the
// hex SHA-256 of the length-prefixed scope and the key, the digest
// redisstore names the record's Redis key by (redisstore.Store.Key), so
// that one record has one id in every store. Pages name records by it
// and never by their key: URLs reach access logs and browser histories.
func RecordID(scope, key string) string {
	in := binary.AppendUvarint(nil, uint64(len(scope)))
	in = append(append(in, scope...), key...)
	sum := sha256.Sum256(in)
	return hex.EncodeToString(sum[:])
}

// validID reports whether s has the form of a RecordID.
func validID(s string) bool {
	return len(s) == 2*sha256.Size && strings.Trim(s, "0123456789abcdef") == ""
}

// Ref names a record for a Source: by scope and key, or, for a record a
// store listed without them (Redis keeps them hashed), by its StoreID.
type Ref struct {
	Scope, Key string
	// StoreID is the store's own name (RecordInfo.ID); set only when the
	// scope and key are unknown.
	StoreID string
}

// named reports whether r names its record by scope and key.
func (r Ref) named() bool { return r.StoreID == "" }

// maxRefs bounds the ids the console remembers.
const maxRefs = 50_000

// refs remembers which record an id names, for the records the console
// has shown (listed or found): a hash cannot be reversed, so a record page
// or a page link resolves its id here. Bounded (least recently used ids
// are forgotten); lost on restart, when links to records must be found
// again.
type refs struct{ c *lru.Cache[string, Ref] }

func newRefs() *refs {
	c, err := lru.New[string, Ref](maxRefs)
	if err != nil {
		panic(err) // only for a non-positive size
	}
	return &refs{c: c}
}

// remember records r under its id and returns the id.
func (m *refs) remember(id string, r Ref) string {
	m.c.Add(id, r)
	return id
}

func (m *refs) lookup(id string) (Ref, bool) { return m.c.Get(id) }
