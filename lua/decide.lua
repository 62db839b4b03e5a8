-- Rate-limit decisions, several per call, each one atomic over the zones of its location: a
-- request is recorded in every zone or in none, so a rejection by one zone never uses up another.
-- The decisions of one call run in order, each seeing what the previous ones wrote, exactly as if
-- each had been its own call (with clock=redis they share one TIME).
--
-- The whole script is one flat function body: Redis runs the body on every call, so it holds no
-- per-algorithm tables or closures to rebuild, only one scratch table and two helpers (the
-- rarer fields' helpers are built only for a call that has such a field, a node batch's key
-- table and `not_local` only for a node batch). What
-- Redis spends per decision is counted in instructions by bench/script-cost.py: a table built
-- per call, a call of a C function (math.max, tonumber, string.format) or a global read is
-- dear against the commands themselves, so the decision's path avoids them.
--
-- KEYS                   the zone keys of decision 1, then those of decision 2, ...
-- ARGV, per decision:    now in ms (or "" to read Redis TIME: one clock for every gateway),
--                        then per zone: algorithm ("l" sliding_log, "r" sliding_log with
--                        request-id members, "p" sliding_log_packed, "c" sliding_counter,
--                        "g" gcra, "q" calendar quota, "b" balance), limit, window in ms, cost
--                        (units this request takes; 0 only reads), burst (gcra only, else 0;
--                        for "r" the member: the request's id)
--   "q" (calendar quota): window = the period, (UTC offset in minutes + 1440) * 10 + kind with
--                        kind 1 hour, 2 day, 3 week (from Monday), 4 month
--   "b" (credit balance): limit only names the plan (the script ignores it), window is ignored,
--                        burst = the balance a missing key starts with (0: a missing key is
--                        an empty balance)
--   "B" (balance admin, a decision of its own): window 1 sets the balance to cost, 2 adds
--                        cost to it; limit and burst are ignored
--   "D" (reset, a decision of its own): deletes the key, whatever it holds; remaining is 1 if
--                        there was one, else 0
--   "G<letter><rid>" (give-back, a decision of its own; letter l p c g q b): returns u = cost
--                        unused units of the reservation rid (below); limit and window as in
--                        the reserve, cost = u (1 to 10^9), burst = the reservation's token
--                        (decimal)
--   "C<letter><rid>" (a charge, a decision of its own; letter l p c g q b): records u = cost
--                        more units (1 to 10^9) of the placement rid (below, settled costs);
--                        limit and window as the zone's, burst as the zone's decisions send it
--                        (g: its burst, b: the missing balance's default, else 0)
--   "V<rid>" (a check, a decision of its own): whether the reservation rid belongs to the key's
--                        present life; limit and window 1, cost and burst 0. Reads only.
-- Reservations (leases, issue 20): a zone that uses them sends its algorithm as
-- "<letter>+<want>:<lease_ms>" (letter l p c g q b; never r, B, D), e.g. "c+50:1000"; want and
-- lease_ms are decimal integers, want above 10^9 counts as 10^9, lease_ms above a year as a year.
-- The decision for `cost` is taken exactly as for the plain letter. If it is allowed, the zone
-- also gets g = min(want, floor(room / 4)) units (0 when room < 4), room being what the zone
-- still admits after this cost (see each algorithm); if not, g = 0 and nothing is reserved.
-- want 0 is an exact decision that still keeps the TTLs a reservation of the key needs.
-- A holder may spend its g units until r + lease_ms, r the decision's clock. Per algorithm:
--   l  the cost is logged at r as ever, the g units as members m0 .. m0+g-1 (integers from 2^52
--      up, all new) scored r + L; PEXPIRE window + L. Why: a unit spent at a <= r + L is logged
--      at s >= a, so it counts in every window (t - W, t] holding a (s > t - W); at the latest
--      reservation r' <= t of those units all the others were written and not pruned (s > t - W
--      >= r' - W), so it saw them all and kept used <= limit.
--   p  the same: g entries of r + L in sorted position; SET PX window + L.
--   c  cost and g go to the bucket of r + L (L capped at the window, so this or the next), or
--      a later one the key already holds (a clock ahead). Moving to the next bucket stores
--      (next, cost + g, current + the previous bucket's weighted share rounded up): read before
--      the next bucket starts (age 255) it weighs fully, i.e. the estimate made now stays the
--      estimate until then. Why: a unit counted in a bucket at or after the one it is spent in
--      never weighs less than the audit (same formula by admission instant) weighs it, and
--      weights only fall with time. PX: to the end of the bucket after the one written. The
--      reset_ms of a reserve zone counts from now (a plain zone, from the start of a bucket
--      ahead, as for a clock ahead).
--   g  conformance is checked at r as ever; the g units are counted as arriving at r + L:
--      TAT' = max(TAT after cost, r + L) + g*T, and g is at most the room: the units that
--      still conform arriving at r + L (none when L >= burst*T). Why: every unit owns a slot
--      [S, S + T) with S >= r + L >= a (spent no later than its slot) and S + T <= r + burst*T
--      <= a + burst*T (checked at r <= a); slots never overlap, so the admissions in [s, t]
--      fit in [s, t + burst*T]: at most burst + (t - s)/T of them.
--   q  count += cost + g; the lease ends at the period's end at the latest (lease_ms answered
--      = min(L, period end - r)). Why: a unit counted in a period is spent in that period.
--   b  DECRBY cost + g, g <= (balance - cost)/4. Why: the balance never goes below zero.
-- The ledger: a reservation belongs to the life of the key it was granted in. Beside each key a
-- reserve zone writes is a sorted set in the key's slot (ledger_of), of the reservations granted
-- in the key's present life: member rid (an integer from Redis TIME in µs, unique in the
-- ledger), score the instant after which no give-back of it is expected (r + L + LEDGER_GRACE).
-- A reserve zone that finds its key missing starts a new life: it deletes the ledger, as a reset
-- ("D") and a balance set on a missing key ("B") do. So after any reset (DEL, FLUSHALL, expiry,
-- "D") no give-back or check of a reservation of an older life finds its rid: a give-back
-- writes nothing, a check answers 0. Between a DEL of the key alone and its new life the
-- ledger is still there, but the key is not: a give-back writes only to an existing key, and a
-- check answers 1 only for one. A key whose ledger cannot share its slot (a brace and no
-- hash tag) is granted nothing.
-- Give-backs write nothing when the reservation is gone (reset, expired, another period):
--   Gl ZREM token .. token+u-1 (the holder sends m0 + units spent); Gp drops up to u entries of
--   value token; Gc takes u from the count of bucket token (current, or previous once the key
--   moved on), never below 0, KEEPTTL; Gq from the count if the key's period starts at token;
--   Gb INCRBY u only if the key exists (a deleted balance was reset); Gg TAT -= u*T, only if the
--   TAT is still exactly the one that reservation left (token, below): later units' slots
--   may have been pushed behind the returned ones and must not move before their arrival (at or
--   below now: DEL, else PX to the TAT). Returning units only removes what was counted for them.
-- A give-back is always ok and is written whatever the other zones of its decision say (as B,
-- D). Its reply: { 1, 1, remaining, r } (remaining 0 when unknown: g, a missing balance), r 1
-- when the reservation was of the key's present life (its rid left the ledger), else 0 and
-- nothing was written. A check ("V") answers { 1, 1, r, 0 }, r 1 when the key exists and rid is
-- in its ledger.
-- Delays (issue 33): a zone's algorithm field may end with "~<D>", D the longest this zone lets
-- the request wait, in ms (decimal, 0 to an hour, 3600000), on l p c g q only, plain or reserve
-- form ("g~5000", "l~0", "c+50:1000~2000"); "~" on anything else, or D above an hour, is bad
-- arguments, and so is a decision whose zones do not all carry it (the module sends "~0" for a
-- zone without delay= beside one with it). Such a zone is taken as a reserve zone (want 0 for a
-- plain letter): a missing key it writes starts a new life, and its TTLs keep entries placed
-- ahead of now; its reset_ms counts from now. The decision is taken exactly as without "~". If
-- it is rejected, each zone's fit time is t_i = now when it is ok, else now + its honest wait
-- (the reset_ms of a rejecting zone, exact or later, never earlier): the request is DELAYED iff
-- every rejecting zone's wait is at most its D and its cost can ever fit (cost <= capacity).
-- Then T = max t_i (> now), and the request is recorded at T in every zone (all or none) as a
-- reservation of `cost` units arriving at T, entered in the ledger until T + LEDGER_GRACE, so
-- that a give-back "G<letter><rid>" (u = cost, burst = token) returns it if the client goes away
-- while waiting, and a reset makes that give-back write nothing; nothing is recorded at now and
-- nothing is granted (want 0). Otherwise the rejection stands, writing nothing (pruning aside).
-- Why recording at T keeps every limit at every instant, by admission instants: each zone's
-- state after the placement is what a decision taken at T would leave (it admits cost there,
-- see below), and every later decision reads it, the units ahead of now included. Monotonicity
-- makes T a fit for every zone: a zone that admits cost at t admits it at any later t' when
-- nothing else is written (log entries leave, the TAT falls behind, weights fall, a new period
-- starts empty or at what was placed in it). Per algorithm:
--   l  `cost` reserved members m0 .. m0+cost-1 (as a grant's) scored T; PEXPIRE until the
--      newest entry leaves the window. Fit: the (used + cost - limit)-th oldest entry's score +
--      window; entries scored ahead (reservations, delayed requests) are in the set and count.
--   p  the same: `cost` entries of T in sorted position; token T; PX as for l.
--   c  cost goes to the bucket of T: this one, or the next one as a reservation moves there
--      (its previous count = this one + the weighted share, read in full until it starts); token
--      that bucket's absolute index. Its fit in the next bucket is the fit of that state (later
--      than the real one by at most the weighted share's weight). A counter holds two buckets
--      only: a fit at the end of the next bucket (cost = limit), or a T of another zone beyond
--      it, cannot be placed, and the request is rejected.
--   g  the units arrive at T: TAT' = max(TAT, T) + cost*T_unit, exactly; token as a grant's.
--      This is limit_req's leaky bucket with delay: burst is the part admitted without delay.
--   q  cost counted in the period holding T: the next one, empty, when this one is full and
--      its end is within D (the key holds one period: its count goes, and now's requests find
--      a later period: no room). A key found in a later period than now's means, for every
--      decision, "no room now; fits at that period's start" (reset_ms = its start - now; a cost
--      0 read is ok, remaining 0): counting now's requests in the next period's count (as for a
--      gateway clock ahead, before delays) would admit them against it, over the limit by
--      admission instants once a delay can move a key on while the current period is full.
--   Zones that were ok now and rejecting ones are recorded alike, at T.
-- Settled costs (issue 32): a zone's field may end with "!" (after "~<D>" when both: "c!",
-- "g~0!"), on l p c g q b only and never on a reserve field ("l+50:1000!" is bad arguments: the
-- module refuses lease= with settle=). The request's cost is then recorded as a placement even
-- when the decision admits it now: at T = now, as a delayed request's is at its T (l: `cost`
-- reserved members m0 .. scored now, token m0; p: `cost` entries of now, token now; c: the
-- bucket of now, or the later one the key holds, token its index; g: the TAT after this cost,
-- token as a grant's; q: the period of now, token its start; b: DECRBY cost, token 0), entered in
-- the ledger until now + SETTLE_HORIZON + LEDGER_GRACE: the settlement comes when the response
-- ends, and a request running longer than an hour keeps its estimate. The decision is taken
-- exactly as without "!"; the zone is a reserve zone asking nothing (a missing key starts a new
-- life, TTLs never shorter than its entries need) and answers seven fields: granted = cost placed
-- (0 if cost is 0 or the decision is rejected: nothing written), lease_ms 0 (the decision's wait
-- when delayed), token, rid (0 for a key that cannot have a ledger: placed all the same). A
-- decision may mix zones with and without "!". With "~", a delayed decision places at T as
-- ever; its "!" zones' ledger entries last until T + SETTLE_HORIZON + LEDGER_GRACE.
-- Several backends (issue 34): "<letter>^" (l p c g q b, plain letters only) is "<letter>!" whose
-- ledger entry lasts LEDGER_GRACE only: a location whose zones live on several Redis deployments
-- places each zone's cost so that, when another deployment refuses the request, a give-back
-- ("G<letter><rid>", u = cost, the placement's token) returns it at once; later, nothing is
-- given back and the entry leaves the ledger.
-- The settlement names the placement by its rid: a value below the estimate gives the
-- difference back ("G<letter><rid>", u = estimate - value, the placement's token; partial
-- give-backs as for any reservation), one above charges the excess ("C<letter><rid>", u = value
-- - estimate). A charge is the letter's decision of u units at now, always ok, PAST the limit,
-- written only if rid is in the key's ledger (it leaves it; else nothing is written): l u plain
-- members scored now, as an admission's; p u entries of now; c the current bucket (or the later
-- one the key holds); g TAT := max(TAT, now) + u*T, exactly, PX to the new TAT; q the period of
-- now (or the later one the key holds); b DECRBY u (a missing key: from its default), so a
-- balance may go negative and then refuses every cost > 0 until topped up. Why at settle time:
-- the units were used by then, and counting them at any earlier instant would rewrite windows
-- that later decisions already read; the key rejects until the window, period or TAT has room
-- again. A reset empties the ledger (a new life deletes it), so a settlement of an older life
-- writes nothing; a charge on a missing key whose ledger still holds rid (expired, or a DEL of
-- the key alone, and no decision since) writes as a decision would and starts its new life: it
-- deletes the ledger, so the old life's other placements give nothing back into it.
-- Reply { 1, 1, remaining, r }: remaining as a decision reads it after the charge (0 floor), r 1
-- when rid was in the ledger.
-- Concurrency (issue 23): "n" holds a key's slots, one sorted-set member per request in flight,
-- scored by the instant its slot lapses. window = the slot's life in ms (lease_time), cost 1
-- takes a slot (0 only reads), burst = the member: the request's own id, never empty. Members
-- scored at or below now have lapsed and are pruned first, on every n, Gn and Rn. The zone has
-- room while the members left number below limit; a request that holds its member already (the
-- same decision sent again) keeps it. Taking writes ZADD now + life and PEXPIRE to the latest
-- score; a rejection writes nothing but the pruning. reset_ms: 0 when admitted, else 1000: no
-- slot has a known end (each is renewed while its request runs), so 1 s is a guess, the
-- shortest Retry-After there is.
--   "Gn" (a decision of its own): releases the member (ZREM); always ok, harmless when it is
--        gone (lapsed, reset, released already, never taken). Reply { 1, 1, remaining, r }, r 1
--        if the member was there (a worker retries the release of a decision that may run
--        late until it hears 1), else 0.
--   "Rn" (a decision of its own): renews the member to now + life; a member gone (lapsed after
--        the pruning, or lost with Redis's data) is written back, whatever the room, since its
--        request is still in flight: reply { 0, 0, remaining, 0 } then ({ 1, 1, ... } when it
--        was there), remaining counting it.
--   Both take cost 1, window = life, burst = the member.
-- A decision's zones run up to the next clock (a number or "", never an algorithm); the last
-- decision has the keys left. So a call of one decision is what it always was, and a batch adds
-- no argument: Redis refuses more than 10 from a connection not yet authenticated, which must
-- still be told the AUTH failure rather than a protocol error.
-- A Cluster node's batch (decisions of several slots that one node serves) declares the keys of
-- its first decision only, as a call may declare keys of one slot: ARGV[1] is then "k<m>" and
-- ARGV[2 .. m+1] are the other decisions' keys, in order, before the decisions' arguments. A key
-- the node does not serve now (resharded, migrating and not here, a node that refuses undeclared
-- keys of other slots) makes that decision's reply the error "NOTLOCAL <Redis's error>", with
-- nothing written, for the module to send it again alone. An undeclared key's first access is
-- its probe: every algorithm reads its key (a caught error) before it writes, and a decision's
-- zones are all read before the second pass writes. When that access fails, EXISTS tells a key
-- the node does not serve (EXISTS fails too, and its error is the reply's) from one it holds
-- with other data (the decision's error, as for a declared key). EXISTS probes remain where a
-- write would come first: a reset ("D") and a check ("V") read nothing of their key, and
-- pruning (l, r at their first read; n, Gn, Rn as it) writes before the decision's later zones
-- are read, so those are probed before it.
--
-- Reply per decision: { allowed, then per zone: ok, remaining, reset_ms }, and for a zone that
-- sent a reserve field or a placement ("!"), or of a decision whose zones sent delay fields, four
-- more: granted, lease_ms, token, rid
--   allowed   0 rejected, 1 admitted now, 2 delayed (a decision with delay fields only): then
--             every zone answers ok 1; remaining what it admits at now after the placement;
--             reset_ms as for an admitted zone; granted = cost, the units placed (0 if cost is
--             0: then token 0 and rid 0, nothing written for that zone); lease_ms the wait
--             T - now (>= 1, the same in every zone); token as below (l m0, p T, c the bucket
--             written, g the TAT left, q the period's start); rid its ledger entry (0 for a key
--             that cannot have a ledger: the placement still happens). A rejected or admitted
--             decision answers zeros for a delay zone's four more (or its reserve's grant).
--   ok        1 if the zone had room for this request's cost
--   remaining units the zone still admits after this decision
--   reset_ms  a rejecting zone: ms until this request would fit (the honest Retry-After);
--             otherwise: ms until the zone admits one unit more than `remaining` (0 if full)
--             "q": always the ms to the period's end, when the whole limit is back (a key in a
--             later period: to its start)
--             "b": always 0, only an operator refills a balance ("B": the same, remaining is
--             the balance written)
--   granted   g (0 when rejected or nothing granted); remaining excludes it. A placement ("!"):
--             the cost placed, already counted in remaining, lease_ms 0, its token and rid
--   lease_ms  the life granted (L; q: capped at the period's end; c: at the window), 0 if g = 0
--   token     what a give-back sends back, 0 if g = 0: l m0, the first reserved member; p r + L;
--             c the absolute index of the bucket written (that of r + L, or the later one the
--             key held); q the period's start in ms; b 0; g (TAT ms mod 2^22) * limit + TAT
--             remainder + 1, the TAT this reservation left, exactly (< 2^52)
--   rid       the reservation's id in the key's ledger, for its give-back and checks; 0 if g = 0
-- or an error for that decision alone (bad arguments, a key holding other data or figures out of
-- range). Every value read is checked before anything is written, so a decision that fails
-- writes nothing, and the decisions before and after it in the call stand.
-- A call of one decision answers that decision's reply itself; a call of several, the array of
-- their replies in order. Keys that do not add up fail the whole call.
--
-- Integers stay exact in doubles below 2^53; limit, burst and cost are at most 10^9 (< 2^30) and
-- the window at most a year (< 2^35 ms), so products such as limit * window may not fit and go
-- through muldiv. GCRA also needs burst * window / limit < 2^52 ms (its state is a time).

-- Globals read once: each read of a global is a table lookup.
local ARGV, type = ARGV, type
local floor, max, min, tonumber, format = math.floor, math.max, math.min, tonumber, string.format
local pcall_redis, call = redis.pcall, redis.call
local pack, unpack_struct = struct.pack, struct.unpack

local EXACT = 2 ^ 53
-- Times read back (ms since the epoch) must be below this (the year 10889) to be ours; so must
-- a reset, which Redis turns into an integer.
local MAX_TIME = 2 ^ 48
-- A balance is a decimal integer of at most 15 digits: exact in a double, and DECRBY or
-- INCRBY by at most 10^9 can never overflow it.
local BALANCE_PATTERN = '^%-?%d+$'
local MAX_BALANCE_LEN = 16
-- Reservations: the reserve field, and the caps of want (units) and lease_ms (a year).
local RESERVE_PATTERN = '^([lpcgqb])%+(%d+):(%d+)$'
local MAX_UNITS, MAX_LEASE = 1000000000, 365 * 86400000
-- Delays: the delay field's ending on a plain letter or a reserve field, and its cap (an hour).
local DELAY_PATTERN, MAX_DELAY = '^([lpcgq][%d+:]*)~(%d+)(!?)$', 3600000
-- sliding_log: reserved members start here, above the µs-clock members of admissions (below 2^52
-- until the year 2112), so that a reservation never makes an admission look for a free member.
local RESERVED_MEMBERS = 2 ^ 52
-- gcra: a reservation's token holds the TAT it left as (ms mod 2^22) * limit + r + 1 (< 2^52).
local TAT_TOKEN_MOD = 4194304

-- A ledger entry outlives its reservation by this long: a give-back retried while Redis was
-- away, or sent at a reload's drain, still finds it.
local LEDGER_GRACE = 10000
-- A placement of a zone that settles ("!") stays in the ledger this long: its settlement comes
-- when the response ends, and a request that runs longer keeps its estimate.
local SETTLE_HORIZON = 3600000

-- Functions: each closure a call builds costs Redis about 300 instructions to make and collect,
-- and each local it captures (an upvalue) about 400 more, paid on every call whatever its
-- decisions use (bench/script-cost.md, issue 31's section). So the two that plain decisions
-- may call (key_error, muldiv) capture nothing, and the helpers of the rarer fields are built
-- in the loop below, once per call and only when the call has such a field: ledger_of,
-- split_rid, packed_upto, add_reserved, period_bounds, enter_ledger.
local ledger_of, split_rid, packed_upto, add_reserved, period_bounds, enter_ledger

-- An error for one decision about one key, short enough for any client's reply-line limit
-- whatever the key's length.
local function key_error(kind, key, what)
  if #key > 100 then
    key = string.sub(key, 1, 100) .. '...'
  end
  return redis.error_reply(kind .. ' ratelimit: ' .. key .. ' ' .. what)
end
-- q, r with a * b = q * c + r, 0 <= r < c, for integers a < 2^32, c < 2^36, b and q < 2^53.
-- A double quotient of integers below 2^53 is never off by enough to change its floor.
local function muldiv(a, b, c)
  local p = a * b
  if p < 2 ^ 53 then -- a product at or above 2^53 never rounds below it (EXACT: no upvalue)
    -- p % c is p - floor(p / c) * c, computed in the VM: no call of math.floor.
    local r = p % c
    return (p - r) / c, r
  end
  local floor = math.floor
  local qb = floor(b / c)
  local rb = b - qb * c
  local ah = floor(a / 65536)
  local al = a - ah * 65536
  local t = ah * rb -- < 2^52
  local q1 = floor(t / c)
  local u = (t - q1 * c) * 65536 + al * rb -- < 2^52 + 2^52
  local q2 = floor(u / c)
  return a * qb + q1 * 65536 + q2, u - q2 * c
end

-- sliding_counter: one 9-byte string per key, (window index mod 256, current count, previous
-- count). A key lives at most two windows, so the index modulo 256 tells its window apart from
-- the others that can still be met: this one, the previous one, or (a gateway clock running
-- behind another) the next one.
local COUNTER_FORMAT, COUNTER_LEN = '<BI4I4', 9
-- gcra: the theoretical arrival time (TAT) kept exactly as whole ms plus a remainder in 1/limit
-- ms, TAT = ms + r / limit with 0 <= r < limit: a double holding ms, and r as a 32-bit integer.
local GCRA_FORMAT, GCRA_LEN = '<dI4', 12
-- sliding_log adds at most this many entries per ZADD, far below Lua's limit on unpacked values.
local ZADD_CHUNK = 256
-- sliding_log_packed: the log as one string of admission times in ms, oldest first, 6 bytes each
-- (enough until the year 10889).
local PACKED_FORMAT, PACKED_LEN = '<I6', 6

-- calendar quota: one 10-byte string per key, (period start in UTC ms, count). The start tells a
-- period from the next when a gateway clock is ahead of the key's expiry.
local QUOTA_FORMAT, QUOTA_LEN = '<I6I4', 10
local DAY, HOUR = 86400000, 3600000
-- Days per month, as bytes: a table would be built on every call.
local MONTH_DAYS = '\31\28\31\30\31\30\31\31\30\31\30\31'

-- Per-zone state from the check to the commit and report: the decision's locals s1 .. s5, ok,
-- fresh, rid, alg .. settle (the loop below), one zone's at a time. A decision of several zones,
-- or with delay fields (whose loops read every zone's), also keeps zone i's at S[o + f],
-- o = ZONE_FIELDS * (i - 1): one table for every field of every zone, made by the first such
-- decision of the call, since each table a call creates (and its collection) costs Redis about
-- as much as parsing a command. The fields:
--   S1 .. S5 what the check read, for the commit and report:
--   sliding_log (l, r)  S1 used, S2 oldest score (nil: not read; the set may be empty)
--   sliding_log_packed  S1 used, S2 oldest score, S3 entries that have left the window,
--                    S4 the string
--   sliding_counter  S1 current, S2 previous, S3 window index, S4 elapsed in it,
--                    S5 previous count weighted into the rolling window, rounded up
--   gcra             S1 ms, S2 r (the TAT), S3 ms, S4 r (the TAT after this request)
--   calendar quota   S1 count, S2 period start, S3 period end, S4 true if that period is
--                    later than now's (the key was found there)
--   balance          S1 balance (a missing key: its default), S2 true if the key is missing
--   give-back        S4 the value (GET), Gl: S1 the set's size, Gg: S1 ms, S2 r (the TAT)
--   OK whether the zone has room; FRESH the key was missing (a reserve zone writing it starts
--   a new life); RID the rid of a give-back or check;
--   ALG .. LEASE its arguments as the first pass read them, for the second: the operation (a
--   reserve field's letter, a give-back's two letters), limit, window, cost, burst (the
--   member's place: 0 or nil), and a reserve field's want and lease_ms (nil for the others);
--   DELAY a delay field's longest wait (read only when every zone of the decision sent one).
--   SETTLE "!" for a zone that places its cost, "C" for a charge, else nil: set for every field
--   longer than a letter, and read only where WANT is (a plain letter never writes it).
--   Each argument is parsed once: tonumber of a decimal string is two strtod calls.
local S1, S2, S3, S4, S5, OK, FRESH, RID, ALG, LIMIT, WIN, COST, BURST, WANT, LEASE, DELAY, SETTLE =
  1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17
local ZONE_FIELDS = 17
local S
local nargv = #ARGV
-- The previous zone's figures (limit, window, cost, burst) as sent and as numbers, and the last
-- algorithm field met: tonumber of a decimal costs two strtod calls, the zones of a batch mostly
-- send the same figures, and strings compare by pointer. No table: building one per call
-- (and hashing into it) costs more than a call of one decision saves.
local fs1, fn1, fs2, fn2, fs3, fn3, fs4, fn4, last_alg

-- The replies: the first decision's alone, a table from the second on (a call of one decision
-- builds none).
local first, replies, ndecisions = nil, nil, 0
local a, k = 1, 0 -- ARGV and keys already consumed
-- The keys: KEYS, and in a node's batch the undeclared ones after them.
local keys, declared = KEYS, #KEYS
-- A node's batch: the NOTLOCAL reply for the first of keys[from .. to] this node does not serve
-- now (EXISTS fails for it), nil when it serves them all; built for node batches only.
local not_local
local undeclared = ARGV[1] ~= '' and string.byte(ARGV[1] or '') == 107
  and tonumber(string.match(ARGV[1], '^k(%d+)$'))
if undeclared then
  if undeclared + 2 > nargv then
    return redis.error_reply('ERR ratelimit: malformed batch at decision 1')
  end
  -- One constructor sizes the table once (filled key by key, an empty one is rehashed at every
  -- power of two: about 800 Redis instructions per decision in calls of 12). Read from ARGV at
  -- 2 - declared, the declared keys' places hold ARGV[1] ("k<m>") and nils, then KEYS. unpack
  -- takes up to about 8,000 values (Lua's C stack); a call of the module's, 64 KiB at most,
  -- holds a few thousand keys at most.
  keys = { unpack(ARGV, 2 - declared, undeclared + 1) }
  for i = 1, declared do
    keys[i] = KEYS[i]
  end
  a = undeclared + 2
  not_local = function(from, to)
    for j = from, to do
      local e = pcall_redis('EXISTS', keys[j])
      if type(e) == 'table' then
        return redis.error_reply('NOTLOCAL ' .. e.err)
      end
    end
  end
end
local nkeys = #keys
-- clock=redis: TIME once per call, read into time_us (µs), and into time_now_s (ms, as a string)
-- once a decision needs it; `seq` numbers the log members taken in this call so that the
-- decisions sharing that microsecond still get distinct members.
local time_us, seq, time_now_s = nil, 0, nil
-- Whether a field met so far in this call is `rare`: other than a plain c, l, g, r, b or n, it
-- needs the helpers built in the loop (header: functions); or `stamp`s: may send now to Redis
-- as a string (l, r, n and the rare ones; formatting it costs about 2,500 instructions). Fields
-- are classified as the loop first meets them (a field equal to the one before is not looked at
-- again), so both hold for the rest of the call.
local rare, stamp = false, false
-- The last TTL a counter's SET sent, as a number and as its string: decisions of one call share
-- the clock (clock=redis) and mostly the window, so most of a batch's counters send the same
-- one, and formatting it is a call of a C function (about 1,300 instructions).
local px_n, px_s
-- Reservations' rids given in this call, past time_us.
local rid_seq = 0
repeat
  -- Numbers go to Redis as strings: it formats every number a script passes (%.17g, a fair
  -- share of a command's cost); figures that came as strings go back as they came.
  local now_s, base_us = ARGV[a], nil
  local now = now_s ~= '' and tonumber(now_s) or nil
  -- The decision's zones: fields up to the next clock (rare and stamp: above).
  local nzones, next_clock = 0, a + 1
  while next_clock <= nargv do
    local f = ARGV[next_clock]
    if f ~= last_alg then
      -- A plain letter is no clock: tonumber (a C call, about 900 instructions) only for others.
      if f == 'l' or f == 'r' or f == 'n' then
        stamp = true
      elseif f ~= 'c' and f ~= 'g' and f ~= 'b' then
        if f == '' or tonumber(f) then
          break
        end
        rare, stamp = true, true
      end
      last_alg = f
    end
    nzones, next_clock = nzones + 1, next_clock + 5
  end
  if next_clock > nargv then
    -- The last decision: missing arguments are its zones' bad arguments, as ever.
    nzones = nkeys - k
  end
  if (not now and now_s and now_s ~= '') or nzones < 1 or k + nzones > nkeys then
    return redis.error_reply('ERR ratelimit: malformed batch at decision ' .. (ndecisions + 1))
  end
  if rare and not ledger_of then
    -- The rarer fields' helpers (header: functions), once per call.
    -- The ledger of `key`, in its slot: after a hash tag the key's own, else one naming the whole
    -- key; nil for a key with a brace but no tag (no name beside it shares its slot).
    ledger_of = function(key)
      local o = string.find(key, '{', 1, true)
      if o then
        local c = string.find(key, '}', o + 1, true)
        if c and c > o + 1 then
          return key .. '|lease'
        end
        return nil
      end
      if string.find(key, '}', 1, true) then
        return nil
      end
      return key .. '|lease{' .. key .. '}'
    end

    -- A give-back "G<letter><rid>", a charge "C<letter><rid>" or a check "V<rid>" as its two-letter (one for V) operation and
    -- its rid; anything else as it came.
    split_rid = function(alg)
      if not alg then
        return nil
      end
      local op, rid = string.match(alg, '^([GC][lpcgqb])(%d+)$')
      if not op then
        op, rid = string.match(alg, '^(V)(%d+)$')
      end
      if op then
        return op, rid
      end
      return alg, nil
    end

    -- The index (0-based) of the first of the packed entries from..to-1 of `v` that is newer than
    -- `t`, or `to`: they are sorted. Most often none has left the window and the new entries go
    -- last, so the ends are looked at first.
    packed_upto = function(v, from, to, t)
      if from == to or unpack_struct(PACKED_FORMAT, v, from * PACKED_LEN + 1) > t then
        return from
      end
      if unpack_struct(PACKED_FORMAT, v, (to - 1) * PACKED_LEN + 1) <= t then
        return to
      end
      while from < to do
        local mid = floor((from + to) / 2)
        if unpack_struct(PACKED_FORMAT, v, mid * PACKED_LEN + 1) <= t then
          from = mid + 1
        else
          to = mid
        end
      end
      return from
    end

    -- sliding_log: n new members m0 .. m0+n-1 scored `score` (a reservation's units, or a delayed
    -- request's place), after the member of the entry scored last (most often the last
    -- reservation's last member), else from 2^52 + the clock in µs; returns m0. ZADD NX first scores
    -- them -inf (no entry in the window has that score): all new, they get their score; else they
    -- go and a further block is tried.
    add_reserved = function(key, n, base_us, score)
      local m0 = RESERVED_MEMBERS + base_us
      local top = tonumber(call('ZRANGE', key, '-1', '-1')[1])
      if top and top >= m0 and top + 1 + n < EXACT then
        m0 = top + 1
      end
      local skip = n
      while true do
        local added, j = 0, 0
        while j < n do
          local args, c = {}, min(n - j, ZADD_CHUNK)
          for x = 1, c do
            args[2 * x - 1] = '-inf'
            args[2 * x] = format('%d', m0 + j + x - 1)
          end
          added = added + call('ZADD', key, 'NX', unpack(args))
          j = j + c
        end
        if added == n then
          break
        end
        call('ZREMRANGEBYSCORE', key, '-inf', '-inf')
        m0, skip = m0 + skip, skip * 2
      end
      local j = 0
      while j < n do
        local args, c = {}, min(n - j, ZADD_CHUNK)
        for x = 1, c do
          args[2 * x - 1] = score
          args[2 * x] = format('%d', m0 + j + x - 1)
        end
        call('ZADD', key, 'XX', unpack(args))
        j = j + c
      end
      return m0
    end

    -- The UTC ms where the period (spec as in the header) holding UTC ms `t` starts and ends.
    -- Civil dates from day numbers (H. Hinnant's days-to-civil, proleptic Gregorian, integers only:
    -- Redis Lua has no os library).
    period_bounds = function(t, spec)
      local kind, off = spec % 10, (floor(spec / 10) - 1440) * 60000
      local l = t + off
      local days = floor(l / DAY)
      local start, len
      if kind == 1 then
        start, len = floor(l / HOUR) * HOUR, HOUR
      elseif kind == 2 then
        start, len = days * DAY, DAY
      elseif kind == 3 then
        start, len = (days - (days + 3) % 7) * DAY, 7 * DAY -- day 0 was a Thursday
      else
        local z = days + 719468
        local era = floor(z / 146097)
        local doe = z - era * 146097
        local yoe = floor((doe - floor(doe / 1460) + floor(doe / 36524) - floor(doe / 146096)) / 365)
        local doy = doe - (365 * yoe + floor(yoe / 4) - floor(yoe / 100))
        local mp = floor((5 * doy + 2) / 153)
        local mday = doy - floor((153 * mp + 2) / 5) -- 0-based
        local m = mp < 10 and mp + 3 or mp - 9
        local y = yoe + era * 400 + (m <= 2 and 1 or 0)
        local n = string.byte(MONTH_DAYS, m)
        if m == 2 and y % 4 == 0 and (y % 100 ~= 0 or y % 400 == 0) then
          n = 29
        end
        start, len = (days - mday) * DAY, n * DAY
      end
      return start - off, start - off + len
    end

    -- A new entry of `ledger` (a reservation, a delayed or settled request's place) kept `life` ms
    -- from `now`: its rid, unique in the ledger (Redis's clock in µs, one more per further entry of
    -- the call), or 0 when the ledger is not ours to write. The ledger is pruned of what no
    -- give-back needs, and its TTL only ever lengthened: other entries may need longer (a
    -- placement that settles lasts an hour).
    enter_ledger = function(ledger, now, now_s, life)
      if not time_us then
        local t = call('TIME')
        time_us = t[1] * 1000000 + t[2]
      end
      local pruned = pcall_redis('ZREMRANGEBYSCORE', ledger, '-inf', now_s)
      if type(pruned) ~= 'number' then
        return 0
      end
      local score, rid = format('%d', now + life), time_us + rid_seq
      while call('ZADD', ledger, 'NX', score, format('%d', rid)) == 0 do
        rid = rid + 1
      end
      rid_seq = rid - time_us + 1
      if call('PTTL', ledger) < life then
        call('PEXPIRE', ledger, format('%d', life))
      end
      return rid
    end
  end
  local gateway_clock = now ~= nil
  if gateway_clock then
    base_us = now * 1000
  else
    if not time_us then
      -- Its two decimal strings read by arithmetic: the same conversion as tonumber's, without
      -- two calls of a C function (about 1,800 instructions).
      local t = call('TIME')
      time_us = t[1] * 1000000 + t[2]
    end
    if stamp and not time_now_s then
      time_now_s = format('%d', floor(time_us / 1000))
    end
    base_us = time_us + seq
    now, now_s = floor(time_us / 1000), time_now_s
  end

  local result, allowed = nil, 1
  -- Zones met so far that sent a delay field: all of the decision's or none.
  local ndelay = 0
  -- A node's batch (header): `failed` the index in `keys` of the key whose first access failed,
  -- `probed` once the decision's later undeclared keys are known to be this node's.
  local failed, probed = nil, false
  -- The zone's state from its check to its commit and report (the fields of S, header), held in
  -- locals: a decision of one zone, the commonest, never writes S nor reads it back. A decision
  -- of several zones, or with delays (whose loops read every zone's), spills each zone's state
  -- to S once it is checked, and loads it back before its commit.
  local alg, held, limit, w, cost, burst, ok, charge
  local s1, s2, s3, s4, s5, fresh, rid, want, lease, delay, settle
  repeat -- `break` ends this decision early with `result` set to its error
    for i = 1, nzones do
      local p, o = a + 1 + 5 * (i - 1), ZONE_FIELDS * (i - 1)
      local key = keys[k + i]
      alg = ARGV[p]
      local x = ARGV[p + 1]
      if x ~= fs1 then
        fs1, fn1 = x, tonumber(x)
      end
      x = ARGV[p + 2]
      if x ~= fs2 then
        fs2, fn2 = x, tonumber(x)
      end
      x = ARGV[p + 3]
      if x ~= fs3 then
        fs3, fn3 = x, tonumber(x)
      end
      x = ARGV[p + 4]
      if x ~= fs4 then
        fs4, fn4 = x, tonumber(x)
      end
      limit, w, cost, burst = fn1, fn2, fn3, fn4
      rid, want = nil, nil
      -- The letter whose data the key holds: the algorithm's, a give-back's second letter.
      held, charge = alg, false
      if alg and #alg > 1 then
        -- A "!" ending is found by the searches every such field goes through anyway: a
        -- reserve field pays no call of a C function for it.
        settle = nil
        if string.find(alg, '~', 2, true) then
          -- A delay field: the letter (or reserve field) it extends, then its longest wait, and
          -- "!" on a plain letter.
          local base, d, place = string.match(alg, DELAY_PATTERN)
          if ndelay ~= i - 1 then
            -- After a zone without one (a zone without one after these: once all are read).
            result = redis.error_reply('ERR ratelimit: bad arguments for zone ' .. i)
            break
          end
          if base and tonumber(d) <= MAX_DELAY and (place == '' or #base == 1) then
            alg, delay, ndelay = base, tonumber(d), ndelay + 1
            if place ~= '' then
              settle, want, lease = '!', 0, 0
            end
          else
            alg = '?'
          end
        end
        alg, rid = split_rid(alg)
        held = alg
        if alg == 'Gn' or alg == 'Rn' then
          -- A slot's release or renewal: the member in the place of burst, as for n.
          held = 'n'
          burst = ARGV[p + 4] ~= '' and 0 or nil
          if cost ~= 1 then
            alg = '?'
          end
        elseif #alg > 1 then
          -- A reserve field or a give-back, which keeps its two letters as `alg`. Anything
          -- else is refused as "?".
          local c1, c2 = nil, nil
          if #alg == 2 then
            c1, c2 = string.byte(alg, 1, 2)
          end
          if c2 == 33 or c2 == 94 then
            -- "<letter>!": a placement, of a letter that counts units; "<letter>^" the same,
            -- given back at once or never.
            alg = string.sub(alg, 1, 1)
            if string.find('lpcgqb', alg, 1, true) then
              settle, want, lease = c2 == 33 and '!' or '^', 0, 0
            else
              alg = '?'
            end
            held = alg
          elseif c1 == 67 then
            -- A charge: the letter's decision of `cost` more units, always ok, written only
            -- while rid is in the ledger (as a reserve zone asking nothing, for the TTLs).
            held = string.match(alg, '^C([lpcgqb])$')
            if held and rid and cost and cost >= 1 and cost <= MAX_UNITS
                and cost == floor(cost) then
              alg, charge, settle, want, lease = held, true, 'C', 0, 0
            else
              alg = '?'
            end
          elseif c1 then
            held = string.match(alg, '^G([lpcgqb])$')
            if not (held and rid and burst and cost and string.match(ARGV[p + 4], '^%d+$')
                and cost >= 1 and cost <= MAX_UNITS and cost == floor(cost) and burst + cost < EXACT
                and (held ~= 'q' or w and w % 10 >= 1 and w % 10 <= 4 and w >= 10 and w < 28800)) then
              alg = '?'
            end
          else
            local want_s, lease_s
            alg, want_s, lease_s = string.match(alg, RESERVE_PATTERN)
            if alg then
              want = min(tonumber(want_s), MAX_UNITS)
              lease = min(tonumber(lease_s), MAX_LEASE)
            else
              alg = '?'
            end
            held = alg
          end
        end
      end
      if alg == 'r' or alg == 'n' then
        -- The log does not burst, nor does a concurrency zone: that field carries the member, a
        -- string that must not be empty.
        burst = ARGV[p + 4] ~= '' and 0 or nil
      end
      for j = 1, i - 1 do
        -- Two zones of one decision on one key (exact keys) must count it alike, or one
        -- would write what the other cannot read.
        if keys[k + j] == key then
          local other = ARGV[a + 1 + 5 * (j - 1)]
          if #other > 2 or string.byte(other, -1) == 33 then
            other = string.sub(other, 1, 1)
          end
          if other ~= alg then
            result = redis.error_reply('ERR ratelimit: zones ' .. j .. ' and ' .. i
              .. ' share a key with different algorithms')
            break
          end
        end
      end
      if result then
        break
      end
      -- The commonest algorithms first: each test costs about as much as a command's byte.
      if not (limit and w and cost and burst) or limit < 1 or w < 1 or cost < 0
          or alg ~= 'c' and alg ~= 'l' and alg ~= 'p' and (
            (alg ~= 'r' and alg ~= 'g' and alg ~= 'q' and alg ~= 'b' and alg ~= 'B'
              and alg ~= 'D' and alg ~= 'n' and alg ~= 'V' and #alg ~= 2)
            or (alg == 'V' and not rid)
            or (alg == 'n' and cost > 1)
            or (alg == 'B' and w ~= 1 and w ~= 2)
            or (alg == 'g' and burst < 1) or (alg == 'b' and burst < 0)
            or (alg == 'q' and (w % 10 < 1 or w % 10 > 4 or w < 10 or w >= 28800))) then
        result = redis.error_reply('ERR ratelimit: bad arguments for zone ' .. i)
        break
      end
      local v
      if alg == 'c' or alg == 'g' or alg ~= 'l' and alg ~= 'r' and alg ~= 'D' and alg ~= 'Gl'
          and alg ~= 'V' and held ~= 'n' then
        -- The other algorithms keep one string per key, of a length that tells it is theirs.
        v = pcall_redis('GET', key)
        -- An error comes as a table, whose length is 0: the fixed lengths tell it from c, g and
        -- q data without a call of type().
        if v and not (held == 'c' and #v == COUNTER_LEN or held == 'g' and #v == GCRA_LEN
            or held == 'q' and #v == QUOTA_LEN) then
          if type(v) == 'table' then
            result, failed = v, k + i
            break
          end
          if not (held == 'p' and #v % PACKED_LEN == 0
              or (held == 'b' or held == 'B') and string.match(v, BALANCE_PATTERN)) then
            result = key_error('WRONGTYPE', key, 'holds other data')
            break
          end
        end
        -- Only setting a balance may replace one too large to count with.
        if v and (held == 'b' or alg == 'B' and w == 2) and #v > MAX_BALANCE_LEN then
          result = key_error('ERR', key, 'holds a balance out of range (15 digits at most)')
          break
        end
        fresh = not v
      elseif alg ~= 'l' and alg ~= 'r' and alg ~= 'Gl' and k + nzones > declared and not probed then
        -- Undeclared keys that no read probes in time (header): a reset's (D) or a check's (V),
        -- and those of the zones after a concurrency zone (n, Gn, Rn), whose first access prunes.
        result = not_local(k + ((alg == 'D' or alg == 'V') and i or i + 1), k + nzones)
        if result then
          break
        end
        probed = true
      end
      if alg == 'l' or alg == 'r' then
        -- Sliding-window log: one sorted-set entry per admitted unit, scored by its ms. An entry
        -- scored s counts while now < s + window. Reading the two oldest first says whether
        -- anything has left the window (pruning only then) and gives the oldest score the reset
        -- needs, most often without another read.
        local e = pcall_redis('ZRANGE', key, '0', '1', 'WITHSCORES')
        if e.err then
          result, failed = e, k + i
          break
        end
        -- tonumber is a call of a C function: not for an empty set (a new key).
        local read, oldest, removed = #e / 2, nil, 0
        if read > 0 then
          oldest = tonumber(e[2])
        end
        if oldest and not (oldest < MAX_TIME) then
          result = key_error('WRONGTYPE', key, 'holds scores that are not times')
          break
        end
        if oldest and oldest <= now - w then
          if k + nzones > declared and not probed then
            -- Pruning is the decision's first write: its later undeclared keys go first.
            result = not_local(k + i + 1, k + nzones)
            if result then
              break
            end
            probed = true
          end
          removed = call('ZREMRANGEBYSCORE', key, '-inf', format('%d', now - w))
          -- One removed: the second oldest is the oldest now. More: not known yet.
          oldest = removed == 1 and tonumber(e[4]) or nil
        end
        fresh = read == 0
        -- Fewer than two read: that was the whole set.
        local used = read - removed
        if read == 2 then
          used = call('ZCARD', key)
        end
        s1, s2 = used, oldest
        ok = used + cost <= limit
      elseif alg == 'p' then
        -- The same log packed: GET and SET instead of four commands, 6 bytes per entry, but
        -- each admission rewrites the string, a cost that grows with the limit.
        v = v or ''
        local n = #v / PACKED_LEN
        local gone = packed_upto(v, 0, n, now - w)
        local used = n - gone
        s1, s2, s3, s4 = used,
          used > 0 and unpack_struct(PACKED_FORMAT, v, gone * PACKED_LEN + 1) or nil, gone, v
        ok = used + cost <= limit
      elseif alg == 'c' then
        -- Sliding-window counter: the count of the current fixed window plus the previous
        -- window's count weighted by how much of it the rolling window still covers.
        local elapsed, cur, prev = now % w, 0, 0
        local idx = (now - elapsed) / w
        if v then
          local st, c, pv = unpack_struct(COUNTER_FORMAT, v)
          local age = (idx - st) % 256
          if age == 0 then
            cur, prev = c, pv
          elseif age == 1 then
            prev = c
          elseif age == 255 then
            -- Written by a gateway whose clock is ahead: count in its window, never overwrite
            -- it with an older one, and weigh the previous window fully.
            idx, elapsed, cur, prev = idx + 1, 0, c, pv
          end
        end
        -- estimate = prev * (w - elapsed) / w + cur, compared as ceil(prev part) + cur.
        local q, r = muldiv(prev, w - elapsed, w)
        local weighted = q + (r > 0 and 1 or 0)
        s1, s2, s3, s4, s5 = cur, prev, idx, elapsed, weighted
        ok = weighted + cur + cost <= limit
      elseif alg == 'g' then
        -- GCRA: units are spaced window/limit ms apart, `burst` of them may arrive at once.
        local ms, r = now, 0
        if v then
          ms, r = unpack_struct(GCRA_FORMAT, v)
          if not (ms >= 0 and ms < MAX_TIME) then
            result = key_error('WRONGTYPE', key, 'holds other data')
            break
          end
          -- r counts 1/limit ms of the limit it was stored with; after a lower limit (a plan
          -- change through a variable) it may not fit: round up to the next ms, < 1 ms late.
          if r >= limit then
            ms, r = ms + 1, 0
          end
          if ms < now then
            ms, r = now, 0
          end
        end
        local cq, cr = muldiv(cost, w, limit)
        local nms, nr = ms + cq, r + cr
        if nr >= limit then
          nms, nr = nms + 1, nr - limit
        end
        -- Admitted while the new TAT is at most burst * window / limit ms ahead of now.
        local bq, br = muldiv(burst, w, limit)
        s1, s2, s3, s4 = ms, r, nms, nr
        ok = nms - now < bq or (nms - now == bq and nr <= br)
      elseif alg == 'q' then
        -- Calendar quota: a count per period, gone with the period.
        local start, stop = period_bounds(now, w)
        local count, later = 0, false
        if v then
          local st, c = unpack_struct(QUOTA_FORMAT, v)
          if st == start then
            count = c
          elseif st > start then
            -- A later period (a gateway clock ahead, or a request delayed into the next period
            -- because this one is full): no room now, whatever its count. Counting now's
            -- requests there would admit them against the next period's count: more than the
            -- limit by admission instants. It fits at that period's start.
            start, stop = period_bounds(st, w)
            count, later = c, true
          end
        end
        s1, s2, s3, s4 = count, start, stop, later
        ok = count + cost <= limit and not later or cost == 0
      elseif alg == 'b' then
        -- Credit balance: a decimal integer the operator sets and tops up (SET, INCRBY).
        local missing = not v
        local balance = missing and burst or tonumber(v)
        s1, s2 = balance, missing
        ok = cost == 0 or balance >= cost
      elseif alg == 'B' or alg == 'D' then
        ok = true
      elseif alg == 'V' then
        -- Anything but the ledger's own sorted set (someone else's data) answers "not there",
        -- and so does a missing key: its units are counted no more, while the ledger outlives a
        -- DEL of the key until a decision starts its new life.
        local ledger, there = ledger_of(key), false
        if ledger and call('EXISTS', key) == 1 then
          local sc = pcall_redis('ZSCORE', ledger, rid)
          there = type(sc) == 'string'
        end
        s1, ok = there, true
      elseif held == 'n' then
        -- Concurrency (n, Gn, Rn): lapsed slots go first, whatever the decision.
        local gone = pcall_redis('ZREMRANGEBYSCORE', key, '-inf', now_s)
        if type(gone) == 'table' then
          result, failed = gone, k + i
          break
        end
        -- A release learns whether its member was there from its ZREM, in the second pass.
        local used = call('ZCARD', key)
        local mine = alg ~= 'Gn' and call('ZSCORE', key, ARGV[p + 4]) ~= false
        s1, s2 = used, mine
        if alg == 'n' then
          ok = mine or used + cost <= limit
        else
          -- A release is always ok; a renewal, only while the slot is still there.
          ok = alg == 'Gn' or mine
        end
      else
        -- A give-back: read here, written in the second pass.
        if alg == 'Gl' then
          local n = pcall_redis('ZCARD', key)
          if type(n) == 'table' then
            result, failed = n, k + i
            break
          end
          s1 = n
        elseif alg == 'Gg' and v then
          local ms, r = unpack_struct(GCRA_FORMAT, v)
          if not (ms >= 0 and ms < MAX_TIME) then
            result = key_error('WRONGTYPE', key, 'holds other data')
            break
          end
          s1, s2 = ms, r
        end
        s4 = v
        ok = true
      end
      if charge then
        -- Past the limit: always ok.
        ok = true
      end
      if nzones > 1 or ndelay ~= 0 then
        -- Sized for two zones up front, not grown a power of two at a time.
        S = S or { nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
          nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil }
        S[o + S1], S[o + S2], S[o + S3], S[o + S4], S[o + S5], S[o + OK], S[o + FRESH], S[o + RID],
          S[o + ALG], S[o + LIMIT], S[o + WIN], S[o + COST], S[o + BURST], S[o + WANT],
          S[o + LEASE], S[o + DELAY], S[o + SETTLE] =
          s1, s2, s3, s4, s5, ok, fresh, rid, alg, limit, w, cost, burst, want, lease, delay, settle
      end
      if not ok then
        allowed = 0
      end
    end
    if result then
      if failed and failed > declared then
        -- An undeclared key's first access failed: NOTLOCAL if EXISTS fails as well (header).
        result = not_local(failed, failed) or result
      end
      break
    end
    if ndelay ~= 0 and ndelay ~= nzones then
      -- Zones 1 .. ndelay sent a delay field, the next one did not.
      result = redis.error_reply('ERR ratelimit: bad arguments for zone ' .. (ndelay + 1))
      break
    end

    if allowed == 0 and ndelay ~= 0 then
      -- Delayed admissions (issue 33): the instant `at` this request fits in every zone, if
      -- each zone that rejects it now lets it wait that long (its delay field).
      local at, fits = now, true
      for i = 1, nzones do
        local o = ZONE_FIELDS * (i - 1)
        if not S[o + OK] then
          local alg, limit, w, cost = S[o + ALG], S[o + LIMIT], S[o + WIN], S[o + COST]
          -- ms from now until the zone admits `cost`; nil: never, or not representable.
          local wait
          if alg == 'l' or alg == 'p' then
            -- Once the (used + cost - limit)-th oldest entry has left the window; entries scored
            -- ahead (reservations, delayed requests) are in the log and count alike.
            if cost <= limit then
              local idx, s = S[o + S1] + cost - limit - 1, nil
              if alg == 'p' then
                s = unpack_struct(PACKED_FORMAT, S[o + S4], (S[o + S3] + idx) * PACKED_LEN + 1)
              else
                local at_idx = format('%d', idx)
                s = tonumber(call('ZRANGE', keys[k + i], at_idx, at_idx, 'WITHSCORES')[2])
              end
              if s and s < MAX_TIME then
                wait = s + w - now
              end
            end
          elseif alg == 'c' then
            local cur, prev, idx, elapsed, weighted =
              S[o + S1], S[o + S2], S[o + S3], S[o + S4], S[o + S5]
            local target = limit - cost
            if target >= 0 then
              -- From the start of the bucket the key holds when that is ahead (elapsed 0 then).
              local ahead = idx * w - now
              ahead = ahead > 0 and ahead or 0
              local r = w - elapsed
              if cur <= target and prev > 0 then
                -- In this bucket, once the previous one's weight has fallen enough.
                r = w - elapsed - muldiv(target - cur, w, prev)
              end
              if r < w - elapsed then
                wait = ahead + r
              else
                -- In the next bucket, as the placement writes it: its previous count is this
                -- one's plus the weighted share (read in full until it starts), so this is
                -- the real fit of that state, never earlier. A fit only at the end of the next
                -- bucket cannot be placed (two buckets on): nil.
                local pv = cur + weighted
                local e = pv > target and w - muldiv(target, w, pv) or 0
                if e < w then
                  wait = ahead + (w - elapsed) + e
                end
              end
            end
          elseif alg == 'g' then
            -- Until the new TAT is within burst spacings of that instant, as the reset of a
            -- rejection; a TAT ahead of now is unchanged by waiting.
            local burst = S[o + BURST]
            if cost <= burst then
              local bq, br = muldiv(burst, w, limit)
              wait = S[o + S3] - now - bq + (S[o + S4] > br and 1 or 0)
            end
          elseif alg == 'q' then
            -- At the next period's start, empty (the key holds one period); a key already in a
            -- later period: at that period's start, if its count leaves room.
            if S[o + S4] then
              if S[o + S1] + cost <= limit then
                wait = S[o + S2] - now
              end
            elseif cost <= limit then
              wait = S[o + S3] - now
            end
          end
          if not wait or wait > S[o + DELAY] then
            fits = false
            break
          end
          if now + wait > at then
            at = now + wait
          end
        end
      end
      for i = 1, fits and nzones or 0 do
        -- A counter holds this bucket and the next one only: a later instant (another zone's)
        -- cannot be placed there.
        local o = ZONE_FIELDS * (i - 1)
        local w = S[o + WIN]
        if S[o + ALG] == 'c' and S[o + COST] > 0 and floor(at / w) > floor(now / w) + 1 then
          fits = false
        end
      end
      if fits then
        -- Recorded at `at` in every zone, as a reservation of `cost` units arriving then (a
        -- give-back returns it), and nothing at now.
        local wait, at_s = at - now, format('%d', at)
        result = { 2, nil, nil, nil, nil, nil, nil, nil }
        local nres = 1
        for i = 1, nzones do
          local o = ZONE_FIELDS * (i - 1)
          local key, alg = keys[k + i], S[o + ALG]
          local limit, w, cost = S[o + LIMIT], S[o + WIN], S[o + COST]
          local remaining, reset, token, rid = 0, 0, 0, 0
          local ledger = cost > 0 and ledger_of(key)
          if ledger and S[o + FRESH] then
            -- The key starts a new life: no reservation of an older one may touch it.
            call('DEL', ledger)
          end
          if alg == 'l' then
            local used = S[o + S1]
            if cost > 0 then
              -- Members as a grant's, scored `at`.
              token = add_reserved(key, cost, base_us, at_s)
              -- Until the newest entry leaves the window: it may be scored later than `at`.
              local newest = tonumber(call('ZRANGE', key, '-1', '-1', 'WITHSCORES')[2])
              call('PEXPIRE', key, format('%d', max(at, newest) + w - now))
              used = used + cost
            end
            if used > 0 then
              -- One unit more than `remaining` is back when this entry leaves the window.
              local at_idx = format('%d', used >= limit and used - limit or 0)
              reset = tonumber(call('ZRANGE', key, at_idx, at_idx, 'WITHSCORES')[2]) + w - now
            end
            remaining = limit - used
          elseif alg == 'p' then
            local used, gone, v = S[o + S1], S[o + S3], S[o + S4]
            if cost > 0 then
              local last = gone + used
              local at_idx = packed_upto(v, gone, last, at)
              v = string.sub(v, gone * PACKED_LEN + 1, at_idx * PACKED_LEN)
                .. string.rep(pack(PACKED_FORMAT, at), cost)
                .. string.sub(v, at_idx * PACKED_LEN + 1)
              gone, used = 0, used + cost
              call('SET', key, v, 'PX',
                format('%d', unpack_struct(PACKED_FORMAT, v, #v - PACKED_LEN + 1) + w - now))
              token = at
            end
            if used > 0 then
              reset = unpack_struct(PACKED_FORMAT, v,
                (gone + (used >= limit and used - limit or 0)) * PACKED_LEN + 1) + w - now
            end
            remaining = limit - used
          elseif alg == 'c' then
            local cur, prev, idx, elapsed, weighted =
              S[o + S1], S[o + S2], S[o + S3], S[o + S4], S[o + S5]
            if cost > 0 then
              if floor(at / w) > idx then
                -- The next bucket, as a reservation moves there: read in full until it starts.
                idx, elapsed, prev, weighted, cur = idx + 1, 0, cur + weighted, cur + weighted, 0
              end
              cur = cur + cost
              call('SET', key, pack(COUNTER_FORMAT, idx % 256, cur, prev), 'PX',
                format('%d', (idx + 2) * w - now))
              token = idx
            end
            remaining = limit - cur - weighted
            remaining = remaining > 0 and remaining or 0
            -- As for an admitted zone: the estimate falling to `target`, from the bucket held.
            local target = limit - remaining - 1
            if cur ~= 0 or prev ~= 0 then
              if cur <= target then
                if target - cur < prev then
                  reset = w - elapsed - muldiv(target - cur, w, prev)
                end
              else
                reset = (w - elapsed) + w - muldiv(target, w, cur)
              end
              if reset > 0 and idx * w > now then
                reset = reset + idx * w - now
              end
            end
          elseif alg == 'g' then
            local burst, ms, r = S[o + BURST], S[o + S1], S[o + S2]
            if cost > 0 then
              -- The units arrive at `at`: limit_req's leaky bucket with delay.
              if ms < at then
                ms, r = at, 0
              end
              local cq, cr = muldiv(cost, w, limit)
              ms, r = ms + cq, r + cr
              if r >= limit then
                ms, r = ms + 1, r - limit
              end
              call('SET', key, pack(GCRA_FORMAT, ms, r), 'PX',
                format('%d', ms - now + (r > 0 and 1 or 0)))
              token = (ms % TAT_TOKEN_MOD) * limit + r + 1
            end
            local uq, ur = muldiv(limit, ms - now, w)
            local up = (ur + r) % w
            remaining = burst - uq - (ur + r - up) / w - (up > 0 and 1 or 0)
            if ms > now or r > 0 then
              local kq, kr = muldiv(burst - (remaining > 0 and remaining or 0) - 1, w, limit)
              reset = ms - now - kq + (r > kr and 1 or 0)
            end
          else
            local count, start, stop = S[o + S1], S[o + S2], S[o + S3]
            if cost > 0 then
              if at >= stop then
                -- The next period, empty: the key holds one period.
                local _
                start, count = stop, 0
                _, stop = period_bounds(start, w)
              end
              count = count + cost
              call('SET', key, pack(QUOTA_FORMAT, start, count), 'PX', format('%d', stop - now))
              token = start
            end
            if start > now then
              -- A later period: no room now, until it starts.
              remaining, reset = 0, start - now
            else
              remaining, reset = limit - count, stop - now
            end
          end
          remaining = remaining > 0 and remaining or 0
          reset = reset > 0 and reset or 0
          if ledger then
            -- Entered in the ledger as a reservation that lasts until `at`, or a placement that
            -- settles ("!") until its settlement may come.
            local life = wait + LEDGER_GRACE + (S[o + SETTLE] == '!' and SETTLE_HORIZON or 0)
            rid = enter_ledger(ledger, now, now_s, life)
          end
          result[nres + 1], result[nres + 2], result[nres + 3], result[nres + 4],
            result[nres + 5], result[nres + 6], result[nres + 7] =
            1, remaining, reset, cost, wait, token, rid
          nres = nres + 7
        end
        break
      end
    end

    -- Sized for one plain zone: growing an array a power of two at a time reallocates it.
    result = { allowed, nil, nil, nil }
    local nres = 1
    for i = 1, nzones do
      local p, o = a + 1 + 5 * (i - 1), ZONE_FIELDS * (i - 1)
      if nzones > 1 then
        s1, s2, s3, s4, s5, ok, fresh, rid, alg, limit, w, cost, burst, want, lease, delay, settle =
          S[o + S1], S[o + S2], S[o + S3], S[o + S4], S[o + S5], S[o + OK], S[o + FRESH], S[o + RID],
          S[o + ALG], S[o + LIMIT], S[o + WIN], S[o + COST], S[o + BURST], S[o + WANT],
          S[o + LEASE], S[o + DELAY], S[o + SETTLE]
      end
      local key, commit = keys[k + i], allowed == 1 and cost > 0
      local remaining, reset
      -- A reserve zone: want (nil for the others; 0 when nothing may be granted), and what it
      -- is granted; its ledger.
      local grant, token, ledger = 0, 0, nil
      if not want then
        lease, settle = 0, nil
        if ndelay ~= 0 then
          -- A delay field: taken as a reserve zone that asks nothing, for the new life of a
          -- missing key and the TTLs of entries delayed ahead of now.
          want = 0
        end
      end
      -- placed: a zone that settles ("!"), admitted with a cost, records it as a placement;
      -- mine: a charge's rid was in the key's ledger (it leaves it).
      local placed, mine = false, false
      if want then
        ledger = ledger_of(key)
        if settle == 'C' then
          -- Written only for the key's present life. A missing key (a DEL of the key alone,
          -- before any decision) is re-created by the charge: that starts its new life, so no
          -- other reservation or placement of the old one is checked, given back or charged
          -- into it.
          if ledger then
            mine = pcall_redis('ZREM', ledger, rid) == 1
            if mine and fresh then
              call('DEL', ledger)
            end
          end
          commit = mine
        else
          placed = (settle == '!' or settle == '^') and commit
          if allowed == 0 or not ledger then
            want = 0
          end
          if ledger and fresh and allowed == 1 then
            -- The key starts a new life: no reservation of an older one may touch it.
            call('DEL', ledger)
          end
        end
      end
      if alg == 'l' or alg == 'p' or alg == 'r' then
        local used, oldest, gone, v = s1, s2, s3, s4
        if want and want > 0 and limit - used - cost >= 4 then
          grant = min(want, floor((limit - used - cost) / 4))
        end
        if placed and alg == 'l' then
          -- Its units as a grant's members, scored now: a give-back names them.
          grant, commit = cost, false
        end
        if commit and alg == 'l' then
          -- Members are integers (compact listpack entries), unique thanks to ZADD NX: the
          -- decision's clock in µs plus one per further unit. A gateway clock is a whole ms
          -- shared by every request of that ms: the count (which only grows within one ms)
          -- spreads them over its 1000 µs, so they rarely need a second try.
          local m = base_us
          if gateway_clock then
            m = m + used % 1000
          end
          local added = 0
          if cost == 1 then
            added = call('ZADD', key, 'NX', now_s, format('%d', m))
            m = m + 1
          else
            local rest = cost
            while rest > 0 do
              local args, n = {}, math.min(rest, ZADD_CHUNK)
              for j = 1, n do
                args[2 * j - 1] = now_s
                args[2 * j] = format('%d', m + j - 1)
              end
              added = added + call('ZADD', key, 'NX', unpack(args))
              m, rest = m + n, rest - n
            end
          end
          -- A member was taken (the same µs on the Redis clock, or a gateway clock that saw the
          -- same ms): move past the newest entry; each try uses a larger member.
          while added < cost do
            local newest = call('ZRANGE', key, '-1', '-1')
            m = max(m, (tonumber(newest[1]) or 0) + 1)
            added = added + call('ZADD', key, 'NX', now_s, format('%d', m))
            m = m + 1
          end
          if not want then
            call('PEXPIRE', key, ARGV[p + 2])
          end
          if not gateway_clock then
            seq = m - time_us
          end
        elseif commit and alg == 'r' then
          -- Request-id members (the audit trail): the request's id, or `<id>:<unit>` for each
          -- unit of a request costing more than one, so the set lists the requests that used
          -- the window. Ids are unique per request, so no member is taken twice.
          local id = ARGV[p + 4]
          if cost == 1 then
            call('ZADD', key, now_s, id)
          else
            local rest, j = cost, 0
            while rest > 0 do
              local args, n = {}, math.min(rest, ZADD_CHUNK)
              for x = 1, n do
                args[2 * x - 1] = now_s
                args[2 * x] = id .. ':' .. format('%d', j + x)
              end
              call('ZADD', key, unpack(args))
              j, rest = j + n, rest - n
            end
          end
          call('PEXPIRE', key, ARGV[p + 2])
        elseif want and alg == 'p' and (commit or grant > 0) then
          -- The cost at now, the reservation at now + lease, each after the entries not newer.
          local t, last = now + lease, gone + used
          local at = packed_upto(v, gone, last, now)
          local at2 = packed_upto(v, at, last, t)
          call('SET', key, string.sub(v, gone * PACKED_LEN + 1, at * PACKED_LEN)
            .. string.rep(pack(PACKED_FORMAT, now), cost)
            .. string.sub(v, at * PACKED_LEN + 1, at2 * PACKED_LEN)
            .. string.rep(pack(PACKED_FORMAT, t), grant) .. string.sub(v, at2 * PACKED_LEN + 1),
            'PX', format('%d', max(w + lease, last > at2 and
              unpack_struct(PACKED_FORMAT, v, (last - 1) * PACKED_LEN + 1) + w - now or 0)))
          token = t
        elseif commit then
          -- After the entries not newer than now: the last ones, unless a gateway clock runs
          -- behind the others.
          local at = packed_upto(v, gone, gone + used, now)
          call('SET', key, string.sub(v, gone * PACKED_LEN + 1, at * PACKED_LEN)
            .. string.rep(pack(PACKED_FORMAT, now), cost) .. string.sub(v, at * PACKED_LEN + 1),
            'PX', ARGV[p + 2])
        elseif alg == 'p' and gone > 0 then
          -- As the log prunes: what has left the window goes, even on a rejection, the TTL stays.
          if used == 0 then
            call('DEL', key)
          else
            call('SET', key, string.sub(v, gone * PACKED_LEN + 1), 'KEEPTTL')
          end
        end
        if grant > 0 and alg == 'l' then
          -- g new members scored now + lease.
          token = add_reserved(key, grant, base_us, format('%d', now + lease))
        end
        if want and alg == 'l' and (commit or grant > 0) then
          -- Entries scored up to now + lease count until now + lease + window; delayed ones,
          -- until the newest leaves.
          local ttl = w + lease
          if ndelay ~= 0 or settle then
            local newest = tonumber(call('ZRANGE', key, '-1', '-1', 'WITHSCORES')[2]) + w - now
            ttl = newest > ttl and newest or ttl
          end
          call('PEXPIRE', key, format('%d', ttl))
        end
        if commit then
          -- The new entries are scored now: the oldest unless an older one is known to stay.
          if used == 0 or (oldest and now < oldest) then
            oldest = now
          end
          used = used + cost
        end
        if grant > 0 then
          local t = now + lease
          if used == 0 or (oldest and t < oldest) then
            oldest = t
          end
          used = used + grant
        end
        remaining = limit - used
        remaining = remaining > 0 and remaining or 0
        if cost > limit then
          -- It can never fit; the module does not even ask.
          reset = w
        elseif used == 0 then
          reset = 0
        else
          -- Admitted or with room: the next unit frees when the oldest entry leaves the window.
          -- Rejected: this request fits once the (used + cost - limit) oldest entries have left.
          local idx = 0
          if not ok then
            idx = used + cost - limit - 1
          end
          if alg == 'p' and idx > 0 then
            oldest = unpack_struct(PACKED_FORMAT, v, (gone + idx) * PACKED_LEN + 1)
          elseif idx > 0 or not oldest then
            local at = format('%d', idx)
            oldest = tonumber(call('ZRANGE', key, at, at, 'WITHSCORES')[2])
          end
          reset = oldest + w - now
          reset = reset > 0 and reset or 0
        end
      elseif alg == 'c' then
        local cur, prev, idx, elapsed, weighted = s1, s2, s3, s4, s5
        -- For a reserve zone: ms until the bucket the key holds starts, when that is the next one.
        local ahead = 0
        if want then
          local room = limit - weighted - cur - cost
          if want > 0 and room >= 4 then
            grant, lease = min(want, floor(room / 4)), min(lease, w)
            if floor((now + lease) / w) > idx then
              -- The next bucket: this one and the previous one's weighted share become its
              -- previous count, read in full until it starts (age 255), then weighed.
              idx, elapsed, prev, weighted, cur = idx + 1, 0, cur + weighted, cur + weighted, 0
            end
            token = idx
          end
          if placed then
            token = idx
          end
          ahead = max(0, idx * w - now)
          if commit or grant > 0 then
            cur = cur + cost + grant
            local px = (idx + 2) * w - now
            if px ~= px_n then
              px_n, px_s = px, format('%d', px)
            end
            call('SET', key, pack(COUNTER_FORMAT, idx % 256, cur, prev), 'PX', px_s)
          end
        elseif commit then
          cur = cur + cost
          -- The current count matters until the end of the next window, where it is the
          -- previous one.
          local px = 2 * w - elapsed
          if px ~= px_n then
            px_n, px_s = px, format('%d', px)
          end
          call('SET', key, pack(COUNTER_FORMAT, idx % 256, cur, prev), 'PX', px_s)
        end
        -- max(0, x) as a comparison: a call of a C function costs Redis far more.
        remaining = limit - cur - weighted
        remaining = remaining > 0 and remaining or 0
        -- The wait until the estimate is at most `target`, if nothing else is admitted meanwhile.
        local target = limit - remaining - 1
        if not ok then
          target = limit - cost
        end
        if not ok or cur ~= 0 or prev ~= 0 then
          if target < 0 then
            reset = w
          elseif cur <= target then
            -- In this window, once the previous window's weight has fallen enough.
            if target - cur >= prev then
              reset = 0
            else
              reset = w - elapsed - muldiv(target - cur, w, prev)
              reset = reset > 0 and reset or 0
            end
          else
            -- Not in this window: in the next one, the current count becomes the weighted one.
            reset = (w - elapsed) + w - muldiv(target, w, cur)
          end
        else
          reset = 0
        end
        if reset > 0 then
          -- Counted from the start of the bucket written: until then the estimate stays.
          reset = reset + ahead
        end
      elseif alg == 'g' then
        local ms, r = s1, s2
        if want and want > 0 then
          -- The granted units arrive at now + lease (or behind this request's units): the room
          -- is what still conforms from there, (now + burst*T - start) / T.
          local sms, sr = s3, s4
          if sms < now + lease then
            sms, sr = now + lease, 0
          end
          local bq, br = muldiv(burst, w, limit)
          local ahead = now + bq - sms
          if ahead >= 0 then
            local q, rem = muldiv(limit, ahead, w)
            local room = q + floor((rem + br - sr) / w)
            if room >= 4 then
              grant = min(want, floor(room / 4))
              local gq, gr = muldiv(grant, w, limit)
              sms, sr = sms + gq, sr + gr
              if sr >= limit then
                sms, sr = sms + 1, sr - limit
              end
              s3, s4 = sms, sr
              token = (sms % TAT_TOKEN_MOD) * limit + sr + 1
            end
          end
        end
        if commit or grant > 0 then
          ms, r = s3, s4
          local px = ms - now + (r > 0 and 1 or 0)
          call('SET', key, pack(GCRA_FORMAT, ms, r), 'PX', format('%d', px > 1 and px or 1))
          if placed then
            token = (ms % TAT_TOKEN_MOD) * limit + r + 1
          end
        end
        -- How far the TAT is ahead, in 1/limit ms: (ms - now) * limit + r, kept as whole windows
        -- (rounded up) to stay exact.
        local uq, ur = muldiv(limit, ms - now, w)
        local up = (ur + r) % w
        remaining = burst - uq - (ur + r - up) / w - (up > 0 and 1 or 0)
        remaining = remaining > 0 and remaining or 0
        if not ok then
          if cost > burst then
            -- It can never fit; the module does not even ask. Answer like the other algorithms.
            reset = w
          else
            -- Until the new TAT is within burst spacings of now.
            local bq, br = muldiv(burst, w, limit)
            reset = max(1, s3 - now - bq + (s4 > br and 1 or 0))
          end
        elseif ms == now and r == 0 then
          reset = 0
        else
          -- One more unit is back once the TAT is within (burst - remaining - 1) spacings.
          local kq, kr = muldiv(burst - remaining - 1, w, limit)
          reset = ms - now - kq + (r > kr and 1 or 0)
          reset = reset > 0 and reset or 0
        end
      elseif alg == 'q' then
        local count, stop, later = s1, s3, s4
        if want and want > 0 and not later and limit - count - cost >= 4 then
          -- Spent in this period or not at all.
          grant = min(want, floor((limit - count - cost) / 4))
          lease, token = min(lease, stop - now), s2
        end
        if commit or grant > 0 then
          -- In the key's period (a charge finds it in a later one as a decision does).
          count = count + cost + grant
          call('SET', key, pack(QUOTA_FORMAT, s2, count), 'PX', format('%d', max(1, stop - now)))
          if placed then
            token = s2
          end
        end
        if later then
          -- The key is in a later period: no room until it starts; only a charge writes there.
          stop, count = s2, limit
        end
        remaining = max(0, limit - count)
        reset = max(0, stop - now)
      elseif alg == 'b' then
        local balance = s1
        if want and want > 0 and balance - cost >= 4 then
          grant = min(want, floor((balance - cost) / 4))
        end
        if commit or grant > 0 then
          -- DECRBY keeps a TTL the operator gave the credits; a default grant is written whole.
          if s2 then
            balance = balance - cost - grant
            call('SET', key, format('%d', balance))
          else
            balance = call('DECRBY', key, format('%d', cost + grant))
          end
        end
        remaining = max(0, balance)
        reset = 0
      elseif alg == 'B' then
        local ledger = fresh and ledger_of(key)
        if ledger then
          -- A balance set where there was none is a new one.
          call('DEL', ledger)
        end
        -- KEEPTTL and INCRBY keep credits that lapse lapsing.
        if w == 1 then
          call('SET', key, ARGV[p + 3], 'KEEPTTL')
          remaining = cost
        else
          remaining = call('INCRBY', key, ARGV[p + 3])
        end
        remaining = max(0, remaining)
        reset = 0
      elseif alg == 'D' then
        remaining, reset = call('DEL', key), 0
        local ledger = ledger_of(key)
        if ledger then
          call('DEL', ledger)
        end
      elseif alg == 'V' then
        remaining, reset = s1 and 1 or 0, 0
      elseif alg == 'n' or alg == 'Gn' or alg == 'Rn' then
        local used, mine, member = s1, s2, ARGV[p + 4]
        -- A renewal writes its member back even when it was gone: its request is in flight, so
        -- slots lost with Redis's data (or lapsed while the worker could not reach it) count
        -- again one renewal later, instead of for as long as their requests run.
        local taken = (alg == 'n' and commit) or alg == 'Rn'
        if taken then
          call('ZADD', key, format('%d', now + w), member)
          if not mine then
            used = used + 1
          end
          -- The key lives as long as its latest slot (zones of other lease times may share it
          -- across a reload).
          local top = call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
          call('PEXPIRE', key, format('%d', max(1, tonumber(top[2]) - now)))
        elseif alg == 'Gn' then
          mine = call('ZREM', key, member) == 1
          if mine then
            used = used - 1
          end
        end
        remaining, reset = max(0, limit - used), 0
        if alg == 'Gn' and mine then
          reset = 1
        end
        if alg == 'n' and not ok then
          reset = 1000
        end
      else
        -- A give-back of u units with its token; nothing is written if the reservation is gone
        -- or of an older life of the key (its rid is not in the ledger).
        local v, u, token_in = s4, cost, burst
        local ledger = ledger_of(key)
        local mine = ledger and pcall_redis('ZREM', ledger, rid) == 1
        remaining, reset = 0, mine and 1 or 0
        if not mine then
          remaining = 0
        elseif alg == 'Gl' then
          local removed, j = 0, 0
          while j < u do
            local args, n = {}, min(u - j, ZADD_CHUNK)
            for x = 1, n do
              args[x] = format('%d', token_in + j + x - 1)
            end
            removed = removed + call('ZREM', key, unpack(args))
            j = j + n
          end
          -- Entries that have left the window but are not pruned yet still count here.
          remaining = max(0, limit - s1 + removed)
        elseif alg == 'Gp' then
          remaining = limit
          if v then
            local n = #v / PACKED_LEN
            local from = packed_upto(v, 0, n, token_in - 1)
            local drop = min(u, packed_upto(v, from, n, token_in) - from)
            if drop > 0 then
              v = string.sub(v, 1, from * PACKED_LEN) .. string.sub(v, (from + drop) * PACKED_LEN + 1)
              n = n - drop
              if n == 0 then
                call('DEL', key)
              else
                call('SET', key, v, 'KEEPTTL')
              end
            end
            remaining = max(0, limit - n + packed_upto(v, 0, n, now - w))
          end
        elseif alg == 'Gc' then
          remaining = limit
          if v then
            local st, c, pv = unpack_struct(COUNTER_FORMAT, v)
            if st == token_in % 256 or st == (token_in + 1) % 256 then
              if st == token_in % 256 then
                c = max(0, c - u)
              else
                pv = max(0, pv - u)
              end
              call('SET', key, pack(COUNTER_FORMAT, st, c, pv), 'KEEPTTL')
            end
            -- The estimate now, as a decision reads it.
            local idx = floor(now / w)
            local elapsed, age, cur, prev = now - idx * w, (idx - st) % 256, 0, 0
            if age == 0 then
              cur, prev = c, pv
            elseif age == 1 then
              prev = c
            elseif age == 255 then
              elapsed, cur, prev = 0, c, pv
            end
            local q, r = muldiv(prev, w - elapsed, w)
            remaining = max(0, limit - cur - q - (r > 0 and 1 or 0))
          end
        elseif alg == 'Gq' then
          remaining = limit
          if v then
            local st, c = unpack_struct(QUOTA_FORMAT, v)
            if st == token_in then
              c = max(0, c - u)
              call('SET', key, pack(QUOTA_FORMAT, st, c), 'KEEPTTL')
            end
            -- A later period than now's has no room now.
            if st == period_bounds(now, w) then
              remaining = max(0, limit - c)
            elseif st > period_bounds(now, w) then
              remaining = 0
            end
          end
        elseif alg == 'Gb' then
          if v then
            remaining = max(0, call('INCRBY', key, format('%d', u)))
          end
        else
          -- Gg: only the TAT this reservation left, exactly: units taken after it may sit in
          -- slots after the returned ones, and moving them earlier could put them before their
          -- arrival (two holders: the second one's units would come too close).
          local ms, r = s1, s2
          if v and r < limit and (ms % TAT_TOKEN_MOD) * limit + r + 1 == token_in then
            local uq, ur = muldiv(u, w, limit)
            ms, r = ms - uq, r - ur
            if r < 0 then
              ms, r = ms - 1, r + limit
            end
            if ms < now or ms == now and r == 0 then
              call('DEL', key)
            else
              call('SET', key, pack(GCRA_FORMAT, ms, r), 'PX',
                format('%d', ms - now + (r > 0 and 1 or 0)))
            end
          end
        end
      end
      if settle == 'C' then
        reset = mine and 1 or 0
      end
      if not (reset < MAX_TIME) then
        -- Only from scores someone else wrote (inf): the longest wait the zone can have.
        reset = w
      end
      result[nres + 1], result[nres + 2], result[nres + 3] = ok and 1 or 0, remaining, reset
      nres = nres + 3
      if want and settle ~= 'C' then
        -- life: how long the ledger keeps it; a placement answers no lease (it waited 0).
        local rid, life = 0, lease
        if placed then
          grant, lease, life = cost, 0, settle == '!' and SETTLE_HORIZON or 0
        end
        if grant == 0 then
          lease, token = 0, 0
        elseif ledger then
          rid = enter_ledger(ledger, now, now_s, life + LEDGER_GRACE)
        end
        result[nres + 1], result[nres + 2], result[nres + 3], result[nres + 4] =
          grant, lease, token, rid
        nres = nres + 4
      end
    end
  until true

  ndecisions = ndecisions + 1
  if ndecisions == 1 then
    first = result
  elseif ndecisions == 2 then
    replies = { first, result }
  else
    replies[ndecisions] = result
  end
  a, k = next_clock, k + nzones
until a > nargv

if ndecisions == 1 then
  return first
end
return replies
