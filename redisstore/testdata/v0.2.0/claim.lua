-- Claim (scope, key). KEYS[1]: the record.
-- ARGV: fingerprint, owner token, lease ms, retention ms.
-- Reply: {outcome, took over (0/1), lease end ms, expires at ms, fingerprint
-- [, encoded response | fence]}; outcomes 1 acquired (with the fence),
-- 2 completed (with the response), 3 in flight, 4 mismatch. Times are the
-- Redis clock's Unix milliseconds.
--
-- The fence (field n) is the Redis clock in microseconds, or the record's
-- previous fence plus one if that is not greater: it grows with every claim
-- of the key, also across releases and expiry, as long as the Redis clock
-- does not go back.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local v = redis.call('HMGET', KEYS[1], 'f', 'l', 'e', 'n')
local fp, lease, exp = v[1], v[2], v[3]
local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
if tonumber(v[4]) and tonumber(v[4]) >= fence then
  fence = tonumber(v[4]) + 1
end
-- Redis fixes the expiry time a script sees when it starts, so a record
-- whose retention ends during the script is still visible: ask the clock.
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
    -- Completed: only now read the response.
    return {2, 0, 0, tonumber(exp) or 0, fp, redis.call('HGET', KEYS[1], 'r')}
  end
  if now < tonumber(lease) then
    return {3, 0, tonumber(lease), tonumber(exp) or 0, fp}
  end
  took = 1 -- the owner's lease ran out: take the record over
end
local l = now + tonumber(ARGV[3])
local e = now + tonumber(ARGV[4])
if took == 1 and tonumber(exp) then
  -- A take-over keeps the record's retention: it never extends it.
  e = tonumber(exp)
end
redis.call('HSET', KEYS[1], 'f', ARGV[1], 't', ARGV[2],
  'l', string.format('%d', l), 'e', string.format('%d', e), 'n', string.format('%d', fence))
redis.call('PEXPIREAT', KEYS[1], string.format('%d', e))
return {1, took, l, e, ARGV[1], fence}
