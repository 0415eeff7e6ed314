package redisstore

import "github.com/redis/go-redis/v9"

// The record is one Redis hash, KEYS[1], with these fields:
//
//	f  the request fingerprint
//	e  the end of retention, Unix milliseconds of the Redis clock
//	t  the owner token             (in flight only)
//	l  the end of the lease, ms    (in flight only)
//	r  the encoded response        (completed only)
//
// The key itself expires at e (PEXPIREAT), so Redis deletes the record
// when its retention ends. Every script reads the time with TIME, so that
// every lease and retention decision is made by the one Redis clock, and
// also compares the stored e with it, because a key whose PEXPIREAT is due
// can stay visible for the rest of a script (Redis fixes the expiry time
// a script sees when it starts).
//
// Numbers are written with string.format('%d') rather than Lua's default
// number-to-string conversion, which keeps only 14 significant digits.

// nowMs is the shared prologue: the Redis server's time in milliseconds.
const nowMs = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`

// claimScript implements Store.Claim.
//
// ARGV: fingerprint, token, lease ms, ttl ms.
// Returns {outcome, tookOver, leaseEnd, expiresAt, fingerprint[, response]}
// with the outcome codes of the claim* constants.
var claimScript = redis.NewScript(nowMs + `
local v = redis.call('HMGET', KEYS[1], 'f', 'l', 'e')
local fp, lease, exp = v[1], v[2], v[3]
if fp and tonumber(exp) and now >= tonumber(exp) then
  redis.call('DEL', KEYS[1])
  fp = false
end
local took = 0
if fp then
  if fp ~= ARGV[1] then
    return {4, 0, tonumber(lease) or 0, tonumber(exp) or 0, fp}
  end
  if not lease then
    local resp = redis.call('HGET', KEYS[1], 'r')
    return {2, 0, 0, tonumber(exp) or 0, fp, resp}
  end
  if now < tonumber(lease) then
    return {3, 0, tonumber(lease), tonumber(exp) or 0, fp}
  end
  took = 1
end
local l = now + tonumber(ARGV[3])
local e = now + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'f', ARGV[1], 't', ARGV[2],
  'l', string.format('%d', l), 'e', string.format('%d', e))
redis.call('PEXPIREAT', KEYS[1], string.format('%d', e))
return {1, took, l, e, ARGV[1]}
`)

// ownedCheck ends a script with 0 unless ARGV[1] is the token of a live,
// in-flight record at KEYS[1]. A completed record has no token field.
const ownedCheck = `
local v = redis.call('HMGET', KEYS[1], 't', 'e')
if v[1] ~= ARGV[1] or not tonumber(v[2]) or now >= tonumber(v[2]) then
  return 0
end
`

// renewScript implements Store.Renew. ARGV: token, lease ms. Returns 1 if
// the lease was extended, 0 if the token does not own the record.
var renewScript = redis.NewScript(nowMs + ownedCheck + `
redis.call('HSET', KEYS[1], 'l', string.format('%d', now + tonumber(ARGV[2])))
return 1
`)

// completeScript implements Store.Complete. ARGV: token, encoded response.
// The key's expiry is left as the claim set it: completion never extends
// retention. Returns 1, or 0 if the token does not own the record.
var completeScript = redis.NewScript(nowMs + ownedCheck + `
redis.call('HSET', KEYS[1], 'r', ARGV[2])
redis.call('HDEL', KEYS[1], 't', 'l')
return 1
`)

// releaseScript implements Store.Release. ARGV: token. Returns 1, or 0 if
// the token does not own the record.
var releaseScript = redis.NewScript(nowMs + ownedCheck + `
redis.call('DEL', KEYS[1])
return 1
`)

// Outcome codes returned by claimScript.
const (
	claimAcquired  = 1
	claimCompleted = 2
	claimInFlight  = 3
	claimMismatch  = 4
)
