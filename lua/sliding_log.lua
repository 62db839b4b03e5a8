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
