package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemhq/idem"
	"github.com/redis/go-redis/v9"
)

var _ idem.Inspector = (*Store)(nil)

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

// Get implements idem.Inspector. RecordInfo.ID is the record's Redis key.
// Expiry is decided by the Redis clock; p.Now is ignored.
func (s *Store) Get(ctx context.Context, p idem.GetParams) (idem.RecordInfo, error) {
	id := s.Key(p.Scope, p.Key)
	v, err := getScript.Run(ctx, s.client, []string{id}).Slice()
	if errors.Is(err, redis.Nil) {
		return idem.RecordInfo{}, idem.ErrNotFound
	}
	if err != nil {
		return idem.RecordInfo{}, fmt.Errorf("redisstore: get: %w", err)
	}
	if len(v) < 3 {
		return idem.RecordInfo{}, fmt.Errorf("redisstore: get: unexpected script reply of %d elements", len(v))
	}
	fp, _ := v[0].(string)
	lease, _ := v[1].(int64)
	exp, _ := v[2].(int64)
	enc := ""
	if len(v) > 3 {
		enc, _ = v[3].(string)
	}
	ri := info(id, fp, lease, exp, len(enc))
	ri.Scope, ri.Key = p.Scope, p.Key
	if lease == 0 {
		ri.Response = new(idem.Response)
		if err := ri.Response.UnmarshalBinary([]byte(enc)); err != nil {
			return idem.RecordInfo{}, fmt.Errorf("redisstore: get: stored response: %w", err)
		}
	}
	return ri, nil
}

func info(id, fp string, lease, exp int64, size int) idem.RecordInfo {
	ri := idem.RecordInfo{ID: id, ResponseSize: size, Record: idem.Record{
		State: idem.StateCompleted, Fingerprint: fp, ExpiresAt: time.UnixMilli(exp).UTC()}}
	if lease != 0 {
		ri.State, ri.LeaseExpiresAt = idem.StateInFlight, time.UnixMilli(lease).UTC()
	}
	return ri
}

// List implements idem.Inspector by scanning the keys under the store's
// prefix (SCAN, on every primary of a cluster), in Redis's order. Records
// name neither scope nor key in clear, so RecordInfo.Scope and Key are
// empty, ID is the Redis key, and ListParams.Key is refused: look a key up
// with Get.
func (s *Store) List(ctx context.Context, p idem.ListParams) ([]idem.RecordInfo, error) {
	if p.Limit <= 0 {
		return nil, errors.New("redisstore: List needs a positive limit")
	}
	if p.Key != "" {
		return nil, errors.New("redisstore: List cannot search by key: Redis holds keys only hashed; give the scope and use Get")
	}
	var out []idem.RecordInfo
	scan := func(ctx context.Context, c redis.UniversalClient) error {
		now, err := c.Time(ctx).Result()
		if err != nil {
			return err
		}
		var cursor uint64
		for len(out) < p.Limit {
			keys, next, err := c.Scan(ctx, cursor, globEscape(s.prefix)+"{*}", 256).Result()
			if err != nil {
				return err
			}
			if err := s.collect(ctx, c, keys, now, p, &out); err != nil {
				return err
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
		return nil
	}
	var err error
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		// One node at a time, so that out needs no lock.
		var (
			mu    sync.Mutex // ForEachMaster calls fn concurrently
			nodes []*redis.Client
		)
		err = cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			nodes = append(nodes, c)
			return nil
		})
		for _, c := range nodes {
			if err != nil || len(out) >= p.Limit {
				break
			}
			err = scan(ctx, c)
		}
	} else {
		err = scan(ctx, s.client)
	}
	if err != nil {
		return nil, fmt.Errorf("redisstore: list: %w", err)
	}
	return out[:min(len(out), p.Limit)], nil
}

// collect reads the records named by keys in one pipeline and appends the
// live ones that p selects.
func (s *Store) collect(ctx context.Context, c redis.UniversalClient, keys []string, now time.Time, p idem.ListParams, out *[]idem.RecordInfo) error {
	if len(keys) == 0 {
		return nil
	}
	pipe := c.Pipeline()
	fields := make([]*redis.SliceCmd, len(keys))
	sizes := make([]*redis.IntCmd, len(keys))
	for i, k := range keys {
		fields[i] = pipe.HMGet(ctx, k, "f", "l", "e")
		sizes[i] = pipe.HStrLen(ctx, k, "r")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
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
		*out = append(*out, ri)
	}
	return nil
}

// Delete implements idem.Inspector, in one script.
func (s *Store) Delete(ctx context.Context, p idem.DeleteParams) error {
	force := "0"
	if p.Force {
		force = "1"
	}
	n, err := deleteScript.Run(ctx, s.client, []string{s.Key(p.Scope, p.Key)}, force).Int64()
	if err != nil {
		return fmt.Errorf("redisstore: delete: %w", err)
	}
	switch n {
	case 0:
		return idem.ErrNotFound
	case 2:
		return idem.ErrInFlight
	}
	return nil
}

// globEscape quotes the characters SCAN's MATCH pattern gives a meaning.
var globEscape = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`).Replace
