-- wrk script for bench/compare.sh: the request mix of one scenario.
--
-- Arguments (after `--`): IDS HOT_PERCENT
--   IDS          rotating consumer ids "bench-0" .. "bench-<IDS-1>" (0: none)
--   HOT_PERCENT  share of requests, 0..100, that carry the one hot id "bench-hot" instead
-- allow:    IDS=10000  HOT_PERCENT=0    every request a different consumer, limit never reached
-- deny:     IDS=0      HOT_PERCENT=100  one consumer, far over its limit
-- mix:      IDS=10000  HOT_PERCENT=10   90 % rotating, 10 % the over-limit consumer
-- keys100k: IDS=100000 HOT_PERCENT=0
--
-- The hot requests are spread evenly (not in bursts of 10) so that every window of the run
-- sees the same mix. Every contender gets exactly the same request sequence.
--
-- done() prints one line that compare.sh parses:
--   BENCH requests=.. duration_us=.. rps=.. p50_us=.. p99_us=.. non2xx=.. socket_errors=..

local next_thread = 1

function setup(thread)
    thread:set("thread_no", next_thread)
    next_thread = next_thread + 1
end

function init(args)
    ids = tonumber(args[1] or "") or 10000
    hot = tonumber(args[2] or "") or 0
    -- Threads start at different offsets of the id space, so that two threads do not send the
    -- same consumer at the same moment (that would be a burst on one key, not "many consumers").
    k = ((thread_no or 1) - 1) * 7919
    n = 0
    hot_headers = { ["X-Consumer-Id"] = "bench-hot" }
end

function request()
    n = n + 1
    if ids == 0 or (hot > 0 and math.floor(n * hot / 100) ~= math.floor((n - 1) * hot / 100)) then
        return wrk.format(nil, nil, hot_headers)
    end
    k = k + 1
    return wrk.format(nil, nil, { ["X-Consumer-Id"] = "bench-" .. (k % ids) })
end

function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        "BENCH requests=%d duration_us=%d rps=%.1f p50_us=%d p99_us=%d non2xx=%d socket_errors=%d\n",
        summary.requests, summary.duration, summary.requests / (summary.duration / 1e6),
        latency:percentile(50), latency:percentile(99), e.status,
        e.connect + e.read + e.write + e.timeout))
end
