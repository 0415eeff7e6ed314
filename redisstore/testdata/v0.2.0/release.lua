-- Release. KEYS[1]: the record. ARGV: owner token.
-- Reply: 1 if the record was deleted, 0 if the token does not own a live,
-- in-flight record.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local v = redis.call('HMGET', KEYS[1], 't', 'e')
if v[1] ~= ARGV[1] or not tonumber(v[2]) or now >= tonumber(v[2]) then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
