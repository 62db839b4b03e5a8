-- Generic cell rate algorithm: one stored theoretical arrival time (TAT) per key. Units are
-- spaced window/limit ms apart; `burst` of them may arrive at once. Exact, O(1) memory, and a
-- denied request stores nothing.

local gcra = {}

-- Tolerance for the rounding of window/limit in floating point, far below a millisecond.
local EPS = 1e-6

function gcra.check(z, now)
  z.T = z.window / z.limit
  local tat = tonumber(redis.call('GET', z.key)) or now
  z.tat = math.max(tat, now)
  z.new_tat = z.tat + z.cost * z.T
  z.ok = z.new_tat - now <= z.burst * z.T + EPS
end

function gcra.commit(z, now)
  z.tat = z.new_tat
  -- %.17g keeps the double exact, so fractional spacings never drift.
  redis.call('SET', z.key, string.format('%.17g', z.tat), 'PX', math.ceil(z.tat - now))
end

function gcra.report(z, now)
  local remaining = math.max(0, math.floor(z.burst - (z.tat - now) / z.T + EPS))
  if not z.ok then
    return remaining, math.max(1, math.ceil(z.new_tat - z.burst * z.T - now - EPS))
  end
  if z.tat <= now then
    return remaining, 0
  end
  -- The next unit is back when the TAT is within (burst - remaining - 1) spacings of now.
  return remaining, math.max(0, math.ceil(z.tat - (z.burst - remaining - 1) * z.T - now - EPS))
end
