-- Sliding-window log: one sorted-set entry per admitted request, scored by its millisecond
-- timestamp. Several zones are decided together: the request is recorded in every zone or in
-- none, so a rejection by one zone never uses up another.
--
-- KEYS[i]          the zone key of zone i
-- ARGV[1]          now in ms, or "" to read Redis TIME (one clock for every gateway)
-- ARGV[2]          member: unique per request, so two requests never collapse into one entry
-- ARGV[3 + 2(i-1)] limit of zone i
-- ARGV[4 + 2(i-1)] window of zone i in ms
--
-- Reply: { allowed, then per zone: ok, remaining, reset_ms }
--   ok        1 if the zone had room for this request
--   remaining requests the zone still admits in the current window
--   reset_ms  ms until the oldest admitted request leaves the window and frees a slot
--             (for a rejecting zone, this is the honest Retry-After)

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local member = ARGV[2]

local reply = { 1 }
local used = {}
for i = 1, #KEYS do
  local limit = tonumber(ARGV[1 + 2 * i])
  local window = tonumber(ARGV[2 + 2 * i])
  -- An entry scored s counts while now < s + window.
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - window)
  used[i] = redis.call('ZCARD', KEYS[i])
  if used[i] >= limit then
    reply[1] = 0
  end
end

for i = 1, #KEYS do
  local key = KEYS[i]
  local limit = tonumber(ARGV[1 + 2 * i])
  local window = tonumber(ARGV[2 + 2 * i])
  local ok = used[i] < limit and 1 or 0
  local remaining = 0
  if reply[1] == 1 then
    redis.call('ZADD', key, now, member)
    redis.call('PEXPIRE', key, window)
    remaining = limit - used[i] - 1
  elseif ok == 1 then
    remaining = limit - used[i]
  end
  local reset = 0
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if oldest[2] then
    reset = tonumber(oldest[2]) + window - now
  end
  reply[#reply + 1] = ok
  reply[#reply + 1] = remaining
  reply[#reply + 1] = reset
end
return reply
