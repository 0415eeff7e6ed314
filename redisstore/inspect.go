package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/redis/go-redis/v9"
)

var _ idemstore.Inspector = (*Store)(nil)

// The operator scripts read the Redis clock like the others, so that a
// record whose retention ended a moment ago is absent for them too.
var (
	// KEYS[1]: the record. Reply: nil if absent or expired, else
	// {fingerprint, lease end ms (0 when completed), expires at ms,
	// encoded response or false}.
	getScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('HMGET', KEYS[1], 'f', 'l', 'e', 'r')
if not v[1] or not tonumber(v[3]) or now >= tonumber(v[3]) then
  return false
end
return {v[1], tonumber(v[2]) or 0, tonumber(v[3]), v[4]}
`)
	// KEYS[1]: the record. ARGV: "1" to delete an in-flight record too.
	// Reply: 0 absent or expired, 1 deleted, 2 in flight (kept).
	deleteScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('HMGET', KEYS[1], 'f', 'l', 'e')
if not v[1] or not tonumber(v[3]) or now >= tonumber(v[3]) then
  return 0
end
if v[2] and ARGV[1] ~= '1' then
  return 2
end
redis.call('DEL', KEYS[1])
return 1
`)
)

// Get implements idemstore.Inspector. RecordInfo.ID is the record's Redis key;
// GetParams.ID names a record by it (as List returns it), and the
// RecordInfo then has no Scope or Key. Expiry is decided by the Redis
// clock; p.Now is ignored.
func (s *Store) Get(ctx context.Context, p idemstore.GetParams) (idemstore.RecordInfo, error) {
	id, err := s.recordName(p.Scope, p.Key, p.ID)
	if err != nil {
		return idemstore.RecordInfo{}, fmt.Errorf("redisstore: get: %w", err)
	}
	v, err := getScript.Run(ctx, s.client, []string{id}).Slice()
	if errors.Is(err, redis.Nil) {
		return idemstore.RecordInfo{}, idemstore.ErrNotFound
	}
	if err != nil {
		return idemstore.RecordInfo{}, fmt.Errorf("redisstore: get: %w", err)
	}
	if len(v) < 3 {
		return idemstore.RecordInfo{}, fmt.Errorf("redisstore: get: unexpected script reply of %d elements", len(v))
	}
	fp, _ := v[0].(string)
	lease, _ := v[1].(int64)
	exp, _ := v[2].(int64)
	enc := ""
	if len(v) > 3 {
		enc, _ = v[3].(string)
	}
	ri := info(id, fp, lease, exp, len(enc))
	if p.ID == "" {
		ri.Scope, ri.Key = p.Scope, p.Key
	}
	if lease == 0 {
		ri.Response = new(idemstore.Response)
		if err := ri.Response.UnmarshalBinary([]byte(enc)); err != nil {
			return idemstore.RecordInfo{}, fmt.Errorf("redisstore: get: stored response: %w", err)
		}
	}
	return ri, nil
}

// recordName returns the Redis key of the record named by id, when given
// (it must be a record name under the store's prefix, as Key makes them),
// or else by scope and key.
func (s *Store) recordName(scope, key, id string) (string, error) {
	if id == "" {
		return s.Key(scope, key), nil
	}
	if _, ok := s.digestOf(id); !ok {
		return "", fmt.Errorf("%w: a record ID here is %s{ and 64 lower-case hexadecimal digits }", idemstore.ErrInvalidID, s.prefix)
	}
	return id, nil
}

// digestOf returns the SHA-256 digest a record name (Key) carries, and
// whether name is one.
func (s *Store) digestOf(name string) ([sha256.Size]byte, bool) {
	var d [sha256.Size]byte
	tag, ok := strings.CutPrefix(name, s.prefix)
	if !ok || len(tag) != 2*sha256.Size+2 || tag[0] != '{' || tag[len(tag)-1] != '}' {
		return d, false
	}
	hexDigits := tag[1 : len(tag)-1]
	if strings.ToLower(hexDigits) != hexDigits {
		return d, false
	}
	if _, err := hex.Decode(d[:], []byte(hexDigits)); err != nil {
		return d, false
	}
	return d, true
}

func info(id, fp string, lease, exp int64, size int) idemstore.RecordInfo {
	ri := idemstore.RecordInfo{ID: id, ResponseSize: size, Record: idemstore.Record{
		State: idemstore.StateCompleted, Fingerprint: fp, ExpiresAt: time.UnixMilli(exp).UTC()}}
	if lease != 0 {
		ri.State, ri.LeaseExpiresAt = idemstore.StateInFlight, time.UnixMilli(lease).UTC()
	}
	return ri
}

// List implements idemstore.Inspector by walking SCAN over the keys under the
// store's prefix: on a Redis Cluster, on each primary in turn, in the order
// of their addresses. Records name neither scope nor key in clear, so
// RecordInfo.Scope and Key are empty, ID is the record's Redis key (Get and
// Delete take it as GetParams.ID), and a ListParams.Key is refused with
// idemstore.ErrKeySearchUnsupported.
//
// SCAN's guarantee is the walk's: a record that lives through the whole
// walk is listed at least once; Redis may return one twice when it shrinks
// its key table during the walk. A page ends where a SCAN step ends (a step
// reads about scanCount keys of the database, most of them other
// applications' on a shared one), so a page may hold fewer records than
// Limit, or none, before the walk's end. The cursor holds the primary's
// address and run ID, the SCAN cursor and, when a page ended inside one
// step, the digests of the records of that step already listed. It is
// refused (idemstore.ErrInvalidCursor) once that primary restarted, failed over
// or left the cluster: a SCAN cursor means nothing to another server.
func (s *Store) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	if p.Limit <= 0 {
		return idemstore.ListPage{}, errors.New("redisstore: list: the limit must be positive")
	}
	if p.Key != "" {
		return idemstore.ListPage{}, fmt.Errorf("redisstore: list: %w", idemstore.ErrKeySearchUnsupported)
	}
	cur, err := parseCursor(p.After)
	if err != nil {
		return idemstore.ListPage{}, fmt.Errorf("redisstore: list: %w", err)
	}
	nodes, err := s.primaries(ctx)
	if err != nil {
		return idemstore.ListPage{}, fmt.Errorf("redisstore: list: %w", err)
	}
	i := 0
	if p.After != "" {
		i = slices.IndexFunc(nodes, func(n node) bool { return n.addr == cur.addr })
		if i < 0 {
			return idemstore.ListPage{}, fmt.Errorf("redisstore: list: %w: the Redis primary it continues on (%s) is no longer one; start the listing again", idemstore.ErrInvalidCursor, cur.addr)
		}
	}
	var page idemstore.ListPage
	for ; i < len(nodes); i++ {
		if nodes[i].addr != cur.addr { // the walk moves on to the next primary
			cur = cursor{addr: nodes[i].addr}
		}
		full, err := s.scanNode(ctx, nodes[i].client, &cur, p, &page.Records)
		if err != nil {
			return idemstore.ListPage{}, fmt.Errorf("redisstore: list: %w", err)
		}
		if full {
			page.Next = cur.String()
			return page, nil
		}
	}
	return page, nil
}

// scanCount is the largest COUNT of a SCAN step: about the number of keys
// of the database (not only this store's) one step reads.
const scanCount = 256

// node is one primary List walks.
type node struct {
	addr   string // "" for a client that is not a cluster client
	client redis.UniversalClient
}

// primaries returns the primaries List walks: the client itself, or each
// primary of a cluster, sorted by address.
func (s *Store) primaries(ctx context.Context) ([]node, error) {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return []node{{client: s.client}}, nil
	}
	var (
		mu    sync.Mutex // ForEachMaster calls fn concurrently
		nodes []node
	)
	err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		nodes = append(nodes, node{addr: c.Options().Addr, client: c})
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(nodes, func(a, b node) int { return strings.Compare(a.addr, b.addr) })
	return nodes, nil
}

// scanNode continues cur's SCAN on c, appending to out the live records p
// selects, and reports whether the page is full: then cur is where the
// next page starts. Otherwise c has no more keys.
func (s *Store) scanNode(ctx context.Context, c redis.UniversalClient, cur *cursor, p idemstore.ListParams, out *[]idemstore.RecordInfo) (bool, error) {
	runID, now, err := serverState(ctx, c)
	if err != nil {
		return false, err
	}
	switch {
	case cur.runID == "":
		cur.runID = runID
	case cur.runID != runID && cur.runID != unknownRun && runID != unknownRun:
		return false, fmt.Errorf("%w: the Redis server it continues on restarted or failed over since (run ID %s, now %s): start the listing again", idemstore.ErrInvalidCursor, cur.runID, runID)
	}
	pattern := globEscape(s.prefix) + "{*}"
	count := min(scanCount, max(1, p.Limit-len(*out)))
	for {
		keys, next, err := c.Scan(ctx, cur.scan, pattern, int64(count)).Result()
		if err != nil {
			return false, err
		}
		recs, err := s.collect(ctx, c, keys, cur.skip, now, p)
		if err != nil {
			return false, err
		}
		recs = dropListed(recs, *out)
		room := p.Limit - len(*out)
		switch {
		case len(recs) <= room:
			// The whole step fits.
			*out = append(*out, recs...)
			cur.scan, cur.skip = next, nil
			if next == 0 {
				return false, nil
			}
			if len(*out) == p.Limit {
				return true, nil
			}
			count = min(scanCount, 2*count)
		case count > 1:
			// Too big a step for the room left: take a smaller one from the
			// same place (SCAN reads about COUNT keys a step).
			count = max(1, min(count/2, room))
		case len(*out) > 0:
			// The next page starts with this step.
			return true, nil
		default:
			// One bucket holds more than the page: list part of it and
			// remember what was listed.
			for _, r := range recs[:room] {
				d, _ := s.digestOf(r.ID)
				cur.skip = append(cur.skip, d)
			}
			*out = append(*out, recs[:room]...)
			return true, nil
		}
	}
}

// dropListed removes from recs the records already in listed or earlier
// in recs. SCAN may return a key more than once while Redis resizes its
// hash table (other keys of the database come and go), so one page could
// otherwise hold a record twice; across pages a repeat stays possible and
// is documented.
func dropListed(recs, listed []idemstore.RecordInfo) []idemstore.RecordInfo {
	out := recs[:0]
	for _, r := range recs {
		same := func(o idemstore.RecordInfo) bool { return o.ID == r.ID }
		if slices.ContainsFunc(listed, same) || slices.ContainsFunc(out, same) {
			continue
		}
		out = append(out, r)
	}
	return out
}

// serverState returns, in one round trip, the run ID of the Redis server c
// talks to, which changes when it restarts (and differs between a primary
// and its replica: a SCAN cursor is valid only on the run that made it),
// and its clock. A server that refuses INFO (renamed or disabled, as some
// managed services do) has the run ID unknownRun: walks on it cannot tell
// a restart.
func serverState(ctx context.Context, c redis.UniversalClient) (string, time.Time, error) {
	pipe := c.Pipeline()
	info := pipe.Info(ctx, "server")
	now := pipe.Time(ctx)
	_, _ = pipe.Exec(ctx) // each command's error is read below
	if err := now.Err(); err != nil {
		return "", time.Time{}, err
	}
	var refused redis.Error
	switch err := info.Err(); {
	case errors.As(err, &refused):
		return unknownRun, now.Val(), nil
	case err != nil:
		return "", time.Time{}, err
	}
	for line := range strings.Lines(info.Val()) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok && v != "" {
			return v, now.Val(), nil
		}
	}
	return unknownRun, now.Val(), nil
}

// unknownRun is the run ID of a server that does not tell its own.
const unknownRun = "?"

// collect reads the records named by keys in one pipeline and returns the
// live ones that p selects, except those whose digest is in skip. Keys that
// are not record names (Key) are not records and are passed over.
func (s *Store) collect(ctx context.Context, c redis.UniversalClient, keys []string, skip [][sha256.Size]byte, now time.Time, p idemstore.ListParams) ([]idemstore.RecordInfo, error) {
	keys = slices.DeleteFunc(keys, func(k string) bool {
		d, ok := s.digestOf(k)
		return !ok || slices.Contains(skip, d)
	})
	if len(keys) == 0 {
		return nil, nil
	}
	pipe := c.Pipeline()
	fields := make([]*redis.SliceCmd, len(keys))
	sizes := make([]*redis.IntCmd, len(keys))
	for i, k := range keys {
		fields[i] = pipe.HMGet(ctx, k, "f", "l", "e")
		sizes[i] = pipe.HStrLen(ctx, k, "r")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	var out []idemstore.RecordInfo
	for i, k := range keys {
		v := fields[i].Val()
		if len(v) != 3 || v[0] == nil {
			continue // deleted since the scan
		}
		fp, _ := v[0].(string)
		ls, _ := v[1].(string)
		es, _ := v[2].(string)
		lease, _ := strconv.ParseInt(ls, 10, 64)
		exp, err := strconv.ParseInt(es, 10, 64)
		if err != nil || now.UnixMilli() >= exp {
			continue
		}
		ri := info(k, fp, lease, exp, int(sizes[i].Val()))
		if p.State != 0 && ri.State != p.State {
			continue
		}
		out = append(out, ri)
	}
	return out, nil
}

// cursor is where a List walk continues: on the primary at addr (run
// runID), at SCAN cursor scan, passing over the records of the step at scan
// whose digests are in skip (listed already). The zero cursor starts a
// walk.
type cursor struct {
	addr  string
	runID string
	scan  uint64
	skip  [][sha256.Size]byte
}

const cursorPrefix = "r1."

// String encodes c: "r1." and the unpadded base64url encoding of the
// address and run ID (each length-prefixed), the SCAN cursor, and the
// number of digests to skip followed by them (uvarints and bytes).
func (c cursor) String() string {
	b := binary.AppendUvarint(nil, uint64(len(c.addr)))
	b = append(b, c.addr...)
	b = binary.AppendUvarint(b, uint64(len(c.runID)))
	b = append(b, c.runID...)
	b = binary.AppendUvarint(b, c.scan)
	b = binary.AppendUvarint(b, uint64(len(c.skip)))
	for _, d := range c.skip {
		b = append(b, d[:]...)
	}
	return cursorPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// parseCursor reads a cursor String made; "" is the zero cursor. Any other
// input is an error wrapping idemstore.ErrInvalidCursor.
func parseCursor(s string) (cursor, error) {
	var c cursor
	if s == "" {
		return c, nil
	}
	bad := func(why string) (cursor, error) {
		return cursor{}, fmt.Errorf("%w: %s", idemstore.ErrInvalidCursor, why)
	}
	rest, ok := strings.CutPrefix(s, cursorPrefix)
	if !ok {
		return bad("it is not a Redis store's cursor (it does not start with " + cursorPrefix + ")")
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(rest)
	if err != nil {
		return bad(err.Error())
	}
	text := func() (string, bool) {
		n, size := binary.Uvarint(b)
		if size <= 0 || n > uint64(len(b)-size) {
			return "", false
		}
		v := string(b[size : size+int(n)])
		b = b[size+int(n):]
		return v, true
	}
	number := func() (uint64, bool) {
		n, size := binary.Uvarint(b)
		if size <= 0 {
			return 0, false
		}
		b = b[size:]
		return n, true
	}
	var n uint64
	var okAddr, okRun, okScan, okN bool
	c.addr, okAddr = text()
	if okAddr {
		c.runID, okRun = text()
	}
	if okRun {
		c.scan, okScan = number()
	}
	if okScan {
		n, okN = number()
	}
	if !okN || n > uint64(len(b))/sha256.Size || uint64(len(b)) != n*sha256.Size {
		return bad("it is truncated or malformed")
	}
	for i := range int(n) {
		c.skip = append(c.skip, [sha256.Size]byte(b[i*sha256.Size:(i+1)*sha256.Size]))
	}
	if c.String() != s { // an overlong number: one position, one cursor
		return bad("it is not in its canonical form")
	}
	return c, nil
}

// Delete implements idemstore.Inspector, in one script. DeleteParams.ID names a
// record as GetParams.ID does.
func (s *Store) Delete(ctx context.Context, p idemstore.DeleteParams) error {
	id, err := s.recordName(p.Scope, p.Key, p.ID)
	if err != nil {
		return fmt.Errorf("redisstore: delete: %w", err)
	}
	force := "0"
	if p.Force {
		force = "1"
	}
	n, err := deleteScript.Run(ctx, s.client, []string{id}, force).Int64()
	if err != nil {
		return fmt.Errorf("redisstore: delete: %w", err)
	}
	switch n {
	case 0:
		return idemstore.ErrNotFound
	case 2:
		return idemstore.ErrInFlight
	}
	return nil
}

// globEscape quotes the characters SCAN's MATCH pattern gives a meaning.
var globEscape = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`).Replace
