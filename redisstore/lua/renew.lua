-- Renew. KEYS[1]: the record. ARGV: owner token, lease ms.
-- Reply: 1 if the lease was extended, 0 if the token does not own a live,
-- in-flight record (a completed record has no token). As in complete.lua,
-- the token is the whole check; the clock gives the new lease's end.
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'l', string.format('%d', now + tonumber(ARGV[2])))
return 1
