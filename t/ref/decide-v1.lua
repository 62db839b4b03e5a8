-- Sliding-window log: one sorted-set entry per admitted unit, scored by its millisecond
-- timestamp. Exact, and the memory grows with the limit: at most `limit` entries per key.
--
-- Members are integers: the request's clock in microseconds, plus one per further unit of the
-- same request (see commit). Integer members are what Redis stores most compactly (a listpack integer, not a
-- string), and `ZADD NX` guarantees they stay unique: two requests never collapse into one
-- entry, whichever gateway and clock they come from.

local sliding_log = {}

function sliding_log.check(z, now)
  -- An entry scored s counts while now < s + window.
  redis.call('ZREMRANGEBYSCORE', z.key, '-inf', now - z.window)
  z.used = redis.call('ZCARD', z.key)
  z.ok = z.used + z.cost <= z.limit
end

-- Adds at most this many entries per ZADD, to stay far below Lua's limit on unpacked values.
local ZADD_CHUNK = 256

-- `base_us` is the decision's clock in microseconds. With a gateway clock it is a whole
-- millisecond, shared by every request of that millisecond: the count (which only grows within
-- one millisecond) spreads them over its 1000 microseconds, so they rarely need a second try.
function sliding_log.commit(z, now, base_us, gateway_clock)
  local m = base_us
  if gateway_clock then
    m = m + z.used % 1000
  end
  local added
  if z.cost == 1 then
    added = redis.call('ZADD', z.key, 'NX', now, string.format('%d', m))
    m = m + 1
  else
    added = 0
    local rest = z.cost
    while rest > 0 do
      local args, n = {}, math.min(rest, ZADD_CHUNK)
      for i = 1, n do
        args[2 * i - 1] = now
        args[2 * i] = string.format('%d', m + i - 1)
      end
      added = added + redis.call('ZADD', z.key, 'NX', unpack(args))
      m, rest = m + n, rest - n
    end
  end
  -- A member was taken: the same microsecond on the Redis clock, or a gateway clock that saw
  -- the same millisecond. Move past the newest entry; each try uses a larger member.
  while added < z.cost do
    local newest = redis.call('ZRANGE', z.key, -1, -1)
    m = math.max(m, (tonumber(newest[1]) or 0) + 1)
    added = added + redis.call('ZADD', z.key, 'NX', now, string.format('%d', m))
    m = m + 1
  end
  redis.call('PEXPIRE', z.key, z.window)
  z.used = z.used + z.cost
end

function sliding_log.report(z, now)
  local remaining = math.max(0, z.limit - z.used)
  if z.cost > z.limit then
    -- It can never fit; the module does not even ask.
    return remaining, z.window
  end
  if z.used == 0 then
    return remaining, 0
  end
  -- Admitted or with room: the next unit frees when the oldest entry leaves the window.
  -- Rejected: this request fits once the (used + cost - limit) oldest entries have left.
  local idx = 0
  if not z.ok then
    idx = z.used + z.cost - z.limit - 1
  end
  local e = redis.call('ZRANGE', z.key, idx, idx, 'WITHSCORES')
  return remaining, math.max(0, tonumber(e[2]) + z.window - now)
end
-- Sliding-window counter: the count of the current fixed window plus the previous window's
-- count weighted by how much of it the rolling window still covers. O(1) memory whatever the
-- limit: one 9-byte string per key, packed as (window index mod 256, current count, previous
-- count). Approximate: the estimate assumes the previous window's requests were evenly spread.

local sliding_counter = {}

-- A key lives at most two windows, so the index modulo 256 tells its window apart from the
-- others that can still be met: this one, the previous one, or (a gateway clock running
-- behind another) the next one.
local COUNTER_FORMAT = '<BI4I4'
local COUNTER_LEN = 9

function sliding_counter.check(z, now)
  local w = z.window
  z.idx = math.floor(now / w)
  z.elapsed = now - z.idx * w
  z.cur, z.prev = 0, 0
  local v = redis.call('GET', z.key)
  if v then
    if #v ~= COUNTER_LEN then
      return redis.error_reply('WRONGTYPE ratelimit: ' .. z.key .. ' holds other data')
    end
    local s, c, p = struct.unpack(COUNTER_FORMAT, v)
    local age = (z.idx - s) % 256
    if age == 0 then
      z.cur, z.prev = c, p
    elseif age == 1 then
      z.prev = c
    elseif age == 255 then
      -- Written by a gateway whose clock is ahead: count in its window, never overwrite it
      -- with an older one, and weigh the previous window fully.
      z.idx, z.elapsed, z.cur, z.prev = z.idx + 1, 0, c, p
    end
  end
  -- estimate = prev * (w - elapsed) / w + cur, compared multiplied by w to stay in integers.
  z.ok = z.prev * (w - z.elapsed) + (z.cur + z.cost) * w <= z.limit * w
end

function sliding_counter.commit(z)
  z.cur = z.cur + z.cost
  -- The current count matters until the end of the next window, where it is the previous one.
  redis.call('SET', z.key, struct.pack(COUNTER_FORMAT, z.idx % 256, z.cur, z.prev),
    'PX', 2 * z.window - z.elapsed)
end

-- ms until the estimate is at most `target`, if nothing else is admitted meanwhile.
local function counter_wait(z, target)
  local w = z.window
  if target < 0 then
    return w
  end
  if z.cur <= target then
    if z.prev == 0 then
      return 0
    end
    local e = w - (target - z.cur) * w / z.prev
    return math.max(0, math.ceil(e - z.elapsed))
  end
  -- Not in this window: in the next one, the current count becomes the weighted one.
  local e = w - target * w / z.cur
  return (w - z.elapsed) + math.max(0, math.ceil(e))
end

function sliding_counter.report(z)
  local w = z.window
  local remaining = math.max(0,
    math.floor((z.limit * w - z.prev * (w - z.elapsed) - z.cur * w) / w))
  if not z.ok then
    return remaining, counter_wait(z, z.limit - z.cost)
  end
  if z.cur == 0 and z.prev == 0 then
    return remaining, 0
  end
  return remaining, counter_wait(z, z.limit - remaining - 1)
end
-- Generic cell rate algorithm: one stored theoretical arrival time (TAT) per key. Units are
-- spaced window/limit ms apart; `burst` of them may arrive at once. Exact, O(1) memory, and a
-- denied request stores nothing.
--
-- The spacing window/limit is rarely a whole number of ms, and doubles near 1.7e12 ms cannot
-- hold its fractions, so the TAT is kept exactly as whole ms plus a remainder in 1/limit ms:
-- TAT = ms + r / limit, 0 <= r < limit. Stored as a 12-byte string (a double holding the whole
-- ms exactly, and r as a 32-bit integer).

local gcra = {}

local GCRA_FORMAT = '<dI4'
local GCRA_LEN = 12

-- TAT minus now, in 1/limit ms.
local function ahead(z, ms, r, now)
  return (ms - now) * z.limit + r
end

function gcra.check(z, now)
  local ms, r = now, 0
  local v = redis.call('GET', z.key)
  if v then
    if #v ~= GCRA_LEN then
      return redis.error_reply('WRONGTYPE ratelimit: ' .. z.key .. ' holds other data')
    end
    ms, r = struct.unpack(GCRA_FORMAT, v)
    -- r counts 1/limit ms of the limit it was stored with; after a lower limit (a plan change
    -- through a variable) it may not fit: round up to the next ms, less than 1 ms late.
    if r >= z.limit then
      ms, r = ms + 1, 0
    end
    if ahead(z, ms, r, now) < 0 then
      ms, r = now, 0
    end
  end
  z.ms, z.r = ms, r
  local nr = r + z.cost * z.window
  z.nms, z.nr = ms + math.floor(nr / z.limit), nr % z.limit
  -- Admitted while the new TAT is at most `burst` spacings (burst * window / limit ms) ahead.
  z.ok = ahead(z, z.nms, z.nr, now) <= z.burst * z.window
end

function gcra.commit(z, now)
  z.ms, z.r = z.nms, z.nr
  local ttl = math.ceil(ahead(z, z.ms, z.r, now) / z.limit)
  redis.call('SET', z.key, struct.pack(GCRA_FORMAT, z.ms, z.r), 'PX', math.max(1, ttl))
end

function gcra.report(z, now)
  local w = z.window
  local used = ahead(z, z.ms, z.r, now)
  local remaining = math.max(0, math.floor((z.burst * w - used) / w))
  if not z.ok then
    if z.cost > z.burst then
      -- It can never fit; the module does not even ask. Answer like the other algorithms.
      return remaining, w
    end
    return remaining, math.max(1, math.ceil((ahead(z, z.nms, z.nr, now) - z.burst * w) / z.limit))
  end
  if used <= 0 then
    return remaining, 0
  end
  -- One more unit is back once the TAT is within (burst - remaining - 1) spacings of now.
  return remaining, math.max(0, math.ceil((used - (z.burst - remaining - 1) * w) / z.limit))
end
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
