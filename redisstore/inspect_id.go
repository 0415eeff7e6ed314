package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/idemhq/idem/idemstore"
	"github.com/redis/go-redis/v9"
)

// GetByID is idemstore.Inspector.Get for a record named by its Redis key (the
// RecordInfo.ID that List returns, which names neither scope nor key in
// clear), for operator tools that list records and then open one. The
// result's Scope and Key are empty. It returns idemstore.ErrNotFound when no
// unexpired record is there, and an error for an id that is not one of
// this store's record keys.
func (s *Store) GetByID(ctx context.Context, id string) (idemstore.RecordInfo, error) {
	if !s.ownsID(id) {
		return idemstore.RecordInfo{}, fmt.Errorf("redisstore: get: %q is not a record key of this store", id)
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
	if lease == 0 {
		ri.Response = new(idemstore.Response)
		if err := ri.Response.UnmarshalBinary([]byte(enc)); err != nil {
			return idemstore.RecordInfo{}, fmt.Errorf("redisstore: get: stored response: %w", err)
		}
	}
	return ri, nil
}

// DeleteByID is idemstore.Inspector.Delete for a record named by its Redis key
// (see GetByID): one atomic step, ErrNotFound if none, ErrInFlight for an
// in-flight record unless force is set.
func (s *Store) DeleteByID(ctx context.Context, id string, force bool) error {
	if !s.ownsID(id) {
		return fmt.Errorf("redisstore: delete: %q is not a record key of this store", id)
	}
	f := "0"
	if force {
		f = "1"
	}
	n, err := deleteScript.Run(ctx, s.client, []string{id}, f).Int64()
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

// ownsID reports whether id has the form of Key's names: the prefix and a
// hex SHA-256 in braces.
func (s *Store) ownsID(id string) bool {
	tag, ok := strings.CutPrefix(id, s.prefix+"{")
	if !ok {
		return false
	}
	tag, ok = strings.CutSuffix(tag, "}")
	return ok && len(tag) == 64 && strings.Trim(tag, "0123456789abcdef") == ""
}
