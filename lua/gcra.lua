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
