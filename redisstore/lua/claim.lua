-- Claim (scope, key). KEYS[1]: the record.
-- ARGV: fingerprint, owner token, lease ms, retention ms.
-- Reply, by outcome (times are the Redis clock's Unix milliseconds):
--   fence (an integer, not an array)                     acquired a new key
--   {1, took over (0/1), lease end, expires at, fence}   acquired a key that had a record
--   {2, expires at, encoded response}                    completed
--   {3, lease end, expires at}                           in flight
--   {4, lease end (0 if completed), expires at, fingerprint}   mismatch
-- Outcomes 1-3 carry no fingerprint: it is ARGV[1]. The fence of a new
-- key is the Redis clock in microseconds, so its lease end and expiry are
-- fence // 1000 + ARGV[3] and + ARGV[4]: the reply leaves them out, and
-- is the bare fence, which costs Redis no Lua table.
--
-- The fence is the Redis clock in microseconds, or the record's previous
-- fence (field n) plus one if that is not greater: it grows with every
-- claim of the key, also across releases and expiry, as long as the Redis
-- clock does not go back. A new key's record does not store its fence (one
-- field less to write, 5 % of a first execution's Redis instructions): no
-- later claim needs it. A take-over needs the clock at or past the lease
-- end l, and l is later than the fence's millisecond (it is that
-- millisecond plus a lease of at least 1 ms, and renew.lua never moves it
-- earlier), so a take-over's clock reading is greater than the fence even
-- if the clock went back. A take-over stores its fence in n, because
-- n + 1 may have exceeded its clock reading (a record of v0.2.0, which
-- always stores n, under a clock that went back).
--
-- Every Lua call costs (Redis spends more on this script's Lua than on
-- its commands). A new key, the common case, is found by one HGET of the
-- fingerprint: an HMGET of four fields, which answers a missing key with
-- a table of four nils, cost a first execution 5.7k more Redis
-- instructions (6 %) than the HGET, and the HMGET that follows for a
-- key with a record costs a replay 4k (redisstore/BENCHMARKS.md). That HMGET reads everything an
-- answer needs, the response included (a completed record has no lease,
-- an in-flight one no response), but not the fence n, which only a
-- take-over needs. Strings become numbers by arithmetic, not tonumber;
-- numbers become strings by string.format('%d'), because Lua's own
-- conversion keeps only 14 significant digits (and is slower).
local fp = redis.call('HGET', KEYS[1], 'f')
local v, lease, exp
if fp then
  v = redis.call('HMGET', KEYS[1], 'l', 'e', 'r')
  lease, exp = v[1], v[2]
end
-- Redis checks a key's expiry against the time the script started, so a
-- record the script sees was live then: a mismatch or a completed record
-- is answered as of that moment, without reading the clock.
if fp then
  if fp ~= ARGV[1] then
    return {4, tonumber(lease) or 0, tonumber(exp) or 0, fp}
  end
  if not lease then
    return {2, tonumber(exp) or 0, v[3]}
  end
end
local t = redis.call('TIME')
local fence = t[1] * 1000000 + t[2]
local now = (fence - fence % 1000) / 1000
local l = now + ARGV[3]
local e = now + ARGV[4]
if not fp then
  local es = string.format('%d', e)
  redis.call('HSET', KEYS[1], 'f', ARGV[1], 't', ARGV[2],
    'l', string.format('%d', l), 'e', es)
  redis.call('PEXPIREAT', KEYS[1], es)
  return fence
end
-- The key holds an in-flight record with this fingerprint.
exp = tonumber(exp)
local gone = exp and now >= exp
if not gone and now < tonumber(lease) then
  return {3, tonumber(lease), exp or 0}
end
local n = tonumber(redis.call('HGET', KEYS[1], 'n'))
if n and n >= fence then
  fence = n + 1
end
local took = 1
if gone then
  -- Its retention ended while the script ran (it is visible, see above):
  -- by the clock it is gone, and the key is claimed anew.
  redis.call('DEL', KEYS[1])
  took = 0
elseif exp then
  -- The owner's lease ran out: take the record over. A take-over keeps
  -- the record's retention: it never extends it.
  e = exp
end
local es = string.format('%d', e)
redis.call('HSET', KEYS[1], 'f', ARGV[1], 't', ARGV[2],
  'l', string.format('%d', l), 'e', es, 'n', string.format('%d', fence))
redis.call('PEXPIREAT', KEYS[1], es)
return {1, took, l, e, fence}
