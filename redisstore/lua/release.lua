-- Release. KEYS[1]: the record. ARGV: owner token.
-- Reply: 1 if the record was deleted, 0 if the token does not own a live,
-- in-flight record. As in complete.lua, the token is the whole check.
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
