-- Complete. KEYS[1]: the record. ARGV: owner token, encoded response.
-- Reply: 1, or 0 if the token does not own a live, in-flight record. The
-- key's expiry stays as the claim set it: completion never extends
-- retention.
--
-- The token is the whole check: only an in-flight record has one, and
-- Redis checks the key's expiry (the end of retention) against the time
-- the script started, so a record the script sees was live then.
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'r', ARGV[2])
redis.call('HDEL', KEYS[1], 't', 'l')
return 1
