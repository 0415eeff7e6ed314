package redisstore

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// A record is one Redis hash with these fields:
//
//	f  the request fingerprint
//	e  the end of retention: Unix milliseconds of the Redis clock
//	t  the owner token            (in flight only)
//	l  the end of the lease, ms   (in flight only)
//	r  the encoded response       (completed only)
//	n  the fence of the last claim: Redis clock microseconds, kept growing
//
// The key expires at e (PEXPIREAT), so Redis deletes the record when its
// retention ends. Every transition is one script in lua/, which reads the
// time with TIME: every lease and retention decision is made by the one
// Redis clock. Numbers are written with string.format('%d'), because Lua's
// default number-to-string conversion keeps only 14 significant digits.
//
// The scripts are sent by SHA-1 (EVALSHA); redis.Script.Run falls back to
// EVAL, which also loads the script, when Redis answers NOSCRIPT.
var (
	//go:embed lua/claim.lua
	claimSource string
	//go:embed lua/renew.lua
	renewSource string
	//go:embed lua/complete.lua
	completeSource string
	//go:embed lua/release.lua
	releaseSource string

	claimScript    = redis.NewScript(claimSource)
	renewScript    = redis.NewScript(renewSource)
	completeScript = redis.NewScript(completeSource)
	releaseScript  = redis.NewScript(releaseSource)
)

// Outcome codes of lua/claim.lua.
const (
	claimAcquired  = 1
	claimCompleted = 2
	claimInFlight  = 3
	claimMismatch  = 4
)
