-- Complete. KEYS[1]: the record. ARGV: owner token, encoded response.
-- Reply: 1, or 0 if the token does not own a live, in-flight record. The
-- key's expiry stays as the claim set it: completion never extends
-- retention.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local v = redis.call('HMGET', KEYS[1], 't', 'e')
if v[1] ~= ARGV[1] or not tonumber(v[2]) or now >= tonumber(v[2]) then
  return 0
end
redis.call('HSET', KEYS[1], 'r', ARGV[2])
redis.call('HDEL', KEYS[1], 't', 'l')
return 1
