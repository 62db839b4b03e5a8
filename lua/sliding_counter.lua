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
