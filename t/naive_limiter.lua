-- The naive design the module replaces, for 090-concurrency.t: a gateway
-- reads the counter, decides on its own, then counts the request.
-- It is called twice per request (ARGV[1] = "get", then "incr" if the count
-- was under the limit), so two round trips separate the check from the
-- update, as in any GET-then-INCR limiter; each call alone is atomic, the
-- decision is not.
--
-- KEYS[1]  counter key
-- ARGV[1]  "get" | "incr"
-- ARGV[2]  window in seconds (fixed window: the counter expires)
if ARGV[1] == 'get' then
  return tonumber(redis.call('GET', KEYS[1]) or '0')
end
local n = redis.call('INCR', KEYS[1])
if n == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[2])
end
return n
