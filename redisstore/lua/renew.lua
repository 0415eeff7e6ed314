-- Renew. KEYS[1]: the record. ARGV: owner token, lease ms.
-- Reply: 1 if the lease was extended, 0 if the token does not own a live,
-- in-flight record (a completed record has no token). As in complete.lua,
-- the token is the whole check; the clock gives the new lease's end.
--
-- The lease end never moves earlier (if the clock went back, the current
-- one stays): claim.lua relies on it being later than the fence of the
-- claim, which a new key's record does not store.
local v = redis.call('HMGET', KEYS[1], 't', 'l')
if v[1] ~= ARGV[1] then
  return 0
end
local t = redis.call('TIME')
local l = t[1] * 1000 + (t[2] - t[2] % 1000) / 1000 + ARGV[2]
local cur = tonumber(v[2])
if cur and cur > l then
  return 1
end
redis.call('HSET', KEYS[1], 'l', string.format('%d', l))
return 1
