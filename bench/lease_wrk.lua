-- wrk script for bench/lease.sh: the consumer ids of one workload, in X-Consumer-Id.
--
-- Arguments (after `--`): WORKLOAD N [S] [SEED]
--   busy N        N busy consumers "busy-0" .. "busy-<N-1>", in turn
--   uniform N     rotating over N ids "u-0" .. "u-<N-1>" (compare.sh's allow: every id in turn,
--                 threads at different offsets)
--   zipf N S SEED ids "z-1" .. "z-N" drawn from Zipf(S): id k with probability k^-S / H(N,S).
--                 The CDF is computed once per thread (N doubles), each draw is a binary search
--                 over it. The generator is seeded with SEED + the thread's number, so that every
--                 contender gets exactly the same sequence of ids per thread.
--
-- done() prints one line that lease.sh parses:
--   BENCH requests=.. duration_us=.. rps=.. p50_us=.. p99_us=.. non2xx=.. socket_errors=..

local next_thread = 1

function setup(thread)
    thread:set("thread_no", next_thread)
    next_thread = next_thread + 1
end

local workload, n, k, cdf

function init(args)
    workload = args[1] or "uniform"
    n = tonumber(args[2] or "") or 10000
    local t = thread_no or 1
    if workload == "zipf" then
        local s = tonumber(args[3] or "") or 1.0
        local seed = tonumber(args[4] or "") or 1
        cdf = {}
        local sum = 0
        for i = 1, n do
            sum = sum + i ^ -s
            cdf[i] = sum
        end
        for i = 1, n do cdf[i] = cdf[i] / sum end
        cdf[n] = 1.0
        -- LuaJIT's math.random is a seeded Tausworthe generator: the same sequence on every run.
        math.randomseed(seed + t)
    elseif workload == "busy" then
        k = t - 1
    else
        -- Threads start at different offsets of the id space, as in compare_wrk.lua.
        k = (t - 1) * 7919
    end
end

-- The smallest i with cdf[i] >= u.
local function zipf_draw()
    local u = math.random()
    local lo, hi = 1, n
    while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        if cdf[mid] < u then lo = mid + 1 else hi = mid end
    end
    return lo
end

function request()
    local id
    if workload == "zipf" then
        id = "z-" .. zipf_draw()
    elseif workload == "busy" then
        k = k + 1
        id = "busy-" .. (k % n)
    else
        k = k + 1
        id = "u-" .. (k % n)
    end
    return wrk.format(nil, nil, { ["X-Consumer-Id"] = id })
end

function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        "BENCH requests=%d duration_us=%d rps=%.1f p50_us=%d p99_us=%d non2xx=%d socket_errors=%d\n",
        summary.requests, summary.duration, summary.requests / (summary.duration / 1e6),
        latency:percentile(50), latency:percentile(99), e.status,
        e.connect + e.read + e.write + e.timeout))
end
