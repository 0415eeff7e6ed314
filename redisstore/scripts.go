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
// itself, with its SHA-1 and source boxed once, which saves the key
// slice, the SHA-1's boxing, a lock and a copy of the arguments on every
// call (redisstore/BENCHMARKS.md).
type script struct {
	src  any // the source, a string
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

// call is the argument list of one script call on one key, with the
// arguments in the same allocation: each is boxed as a pointer to its
// copy in the call, which go-redis writes as the value (a *string or
// *int64; a *blob as its bytes). Boxing a string, an int64 or a []byte
// itself allocates, so a call costs one allocation where the list and
// each argument cost one before (four fewer per claim, three per
// completion: redisstore/BENCHMARKS.md).
type call struct {
	argv [8]any // evalsha, SHA-1, 1, key, then ARGV
	strs [3]string
	nums [2]int64
	blob blob
	n    uint8 // arguments in argv
	ns   uint8 // strings in strs, the key first
	nn   uint8 // numbers in nums
}

// blob is a []byte argument that its pointer boxes.
type blob []byte

// MarshalBinary returns b's bytes, which go-redis sends as the argument.
func (b *blob) MarshalBinary() ([]byte, error) { return *b, nil }

// newCall returns the argument list of a call on the record key.
func newCall(key string) *call {
	c := &call{n: 4, ns: 1}
	c.strs[0] = key
	c.argv[3] = &c.strs[0]
	return c
}

// str appends a string argument.
func (c *call) str(s string) *call {
	c.strs[c.ns] = s
	c.argv[c.n] = &c.strs[c.ns]
	c.ns++
	c.n++
	return c
}

// num appends a number argument.
func (c *call) num(v int64) *call {
	c.nums[c.nn] = v
	c.argv[c.n] = &c.nums[c.nn]
	c.nn++
	c.n++
	return c
}

// bytes appends b, the call's only []byte argument.
func (c *call) bytes(b []byte) *call {
	c.blob = b
	c.argv[c.n] = &c.blob
	c.n++
	return c
}

// run runs the script with the arguments of c.
func (sc *script) run(ctx context.Context, p processor, c *call) *redis.Cmd {
	a := c.argv[:c.n]
	a[0], a[1], a[2] = "evalsha", sc.hash, 1
	cmd := redis.NewCmd(ctx, a...)
	cmd.SetFirstKeyPos(3) // the key decides the Cluster slot
	// HasErrorPrefix allocates even for a nil error: ask it only about one.
	if err := p.Process(ctx, cmd); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		a[0], a[1] = "eval", sc.src
		cmd = redis.NewCmd(ctx, a...)
		cmd.SetFirstKeyPos(3)
		_ = p.Process(ctx, cmd)
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
