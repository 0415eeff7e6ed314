-- Renew. KEYS[1]: the record. ARGV: owner token, lease ms.
-- Reply: 1 if the lease was extended, 0 if the token does not own a live,
-- in-flight record (a completed record has no token).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local v = redis.call('HMGET', KEYS[1], 't', 'e')
if v[1] ~= ARGV[1] or not tonumber(v[2]) or now >= tonumber(v[2]) then
  return 0
end
redis.call('HSET', KEYS[1], 'l', string.format('%d', now + tonumber(ARGV[2])))
return 1
