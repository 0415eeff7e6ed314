package redisstore

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"

	"github.com/redis/go-redis/v9"
)

// A record is one Redis hash with these fields:
//
//	f  the request fingerprint
//	e  the end of retention: Unix milliseconds of the Redis clock
//	t  the owner token            (in flight only)
//	l  the end of the lease, ms   (in flight only)
//	r  the encoded response       (completed only)
//	n  the fence of the last take-over: Redis clock microseconds, kept
//	   growing (absent until a take-over: a new key's claim does not
//	   store its fence, see lua/claim.lua; v0.2.0 stores it always)
//
// The key expires at e (PEXPIREAT), so Redis deletes the record when its
// retention ends. Every transition is one script in lua/, and every lease
// and retention decision is made by the one Redis clock: a script reads it
// with TIME where it starts or checks a lease (a claim of a new or
// in-flight key, a renewal), and otherwise relies on Redis's own expiry,
// which hides a key from a script once its retention ended before the
// script started (a replay, a completion, a release). Numbers are written
// with string.format('%d'), because Lua's default number-to-string
// conversion keeps only 14 significant digits.
//
// The format is that of v0.2.0: instances of both versions share records
// during a rolling upgrade (TestRollingUpgrade runs v0.2.0's scripts,
// kept in testdata/v0.2.0, against this version's).
//
// The scripts are sent by SHA-1 (EVALSHA), falling back to EVAL, which
// also loads the script, when Redis answers NOSCRIPT.
var (
	//go:embed lua/claim.lua
	claimSource string
	//go:embed lua/renew.lua
	renewSource string
	//go:embed lua/complete.lua
	completeSource string
	//go:embed lua/release.lua
	releaseSource string

	claimScript    = newScript(claimSource)
	renewScript    = newScript(renewSource)
	completeScript = newScript(completeSource)
	releaseScript  = newScript(releaseSource)
)

// script is a Lua script on one key, run as redis.Script.Run runs one:
// EVALSHA, then EVAL when Redis answers NOSCRIPT. It builds the command
// itself, with its SHA-1 boxed once, which saves the key slice, the
// SHA-1's boxing, a lock and a copy of the arguments on every call (two
// to three allocations of a store call; redisstore/BENCHMARKS.md).
type script struct {
	src  string
	hash any // the hex SHA-1 of src, a string
}

func newScript(src string) *script {
	sum := sha1.Sum([]byte(src))
	return &script{src: src, hash: hex.EncodeToString(sum[:])}
}

// processor is what runs a command: a redis.UniversalClient, or the
// *redis.Conn that WAIT needs.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// run runs the script on key with args (which it does not keep).
func (sc *script) run(ctx context.Context, c processor, key string, args ...any) *redis.Cmd {
	a := make([]any, 4+len(args))
	a[0], a[1], a[2], a[3] = "evalsha", sc.hash, 1, key
	copy(a[4:], args)
	cmd := redis.NewCmd(ctx, a...)
	cmd.SetFirstKeyPos(3) // the key decides the Cluster slot
	// HasErrorPrefix allocates even for a nil error: ask it only about one.
	if err := c.Process(ctx, cmd); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		a[0], a[1] = "eval", sc.src
		cmd = redis.NewCmd(ctx, a...)
		cmd.SetFirstKeyPos(3)
		_ = c.Process(ctx, cmd)
	}
	return cmd
}

// Outcome codes of lua/claim.lua.
const (
	claimAcquired  = 1
	claimCompleted = 2
	claimInFlight  = 3
	claimMismatch  = 4
)
