-- One rate-limit decision over the zones of a location, atomically: the request is recorded in
-- every zone or in none, so a rejection by one zone never uses up another. Runs after the
-- algorithm files (sliding_log.lua, sliding_counter.lua, gcra.lua), which src/script.rs
-- concatenates before this one into a single script.
--
-- KEYS[i]                zone key of zone i
-- ARGV[1]                now in ms, or "" to read Redis TIME (one clock for every gateway)
-- ARGV[2 + 5(i-1)] ..    per zone: algorithm ("l" sliding_log, "c" sliding_counter, "g" gcra),
--                        limit, window in ms, cost (units this request takes; 0 only reads),
--                        burst (gcra only, else 0)
--
-- Reply: { allowed, then per zone: ok, remaining, reset_ms }
--   ok        1 if the zone had room for this request's cost
--   remaining units the zone still admits after this decision
--   reset_ms  a rejecting zone: ms until this request would fit (the honest Retry-After);
--             otherwise: ms until the zone admits one unit more than `remaining` (0 if full)

local ALGORITHMS = { l = sliding_log, c = sliding_counter, g = gcra }

local now, base_us = tonumber(ARGV[1]), nil
local gateway_clock = now ~= nil
if gateway_clock then
  base_us = now * 1000
else
  local t = redis.call('TIME')
  base_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  now = math.floor(base_us / 1000)
end

local zones, allowed = {}, 1
for i = 1, #KEYS do
  local a = 2 + 5 * (i - 1)
  local z = {
    alg = ALGORITHMS[ARGV[a]],
    key = KEYS[i],
    limit = tonumber(ARGV[a + 1]),
    window = tonumber(ARGV[a + 2]),
    cost = tonumber(ARGV[a + 3]),
    burst = tonumber(ARGV[a + 4]),
  }
  if not (z.alg and z.limit and z.window and z.cost and z.burst)
      or z.limit < 1 or z.window < 1 or z.cost < 0 or (z.alg == gcra and z.burst < 1) then
    return redis.error_reply('ERR ratelimit: bad arguments for zone ' .. i)
  end
  local err = z.alg.check(z, now)
  if err then
    return err
  end
  if not z.ok then
    allowed = 0
  end
  zones[i] = z
end

local reply = { allowed }
for i = 1, #zones do
  local z = zones[i]
  if allowed == 1 and z.cost > 0 then
    z.alg.commit(z, now, base_us, gateway_clock)
  end
  local remaining, reset = z.alg.report(z, now)
  reply[#reply + 1] = z.ok and 1 or 0
  reply[#reply + 1] = remaining
  reply[#reply + 1] = reset
end
return reply
