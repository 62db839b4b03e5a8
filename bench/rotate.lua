-- wrk script for bench/run.sh.
--
-- Every request carries X-Consumer-Id, rotating over N consumer ids (N = first script argument,
-- default 10000), so that no consumer gets near the zone's limit and every request of the
-- limited location is a full, admitted decision (one Redis script call that records it).
-- The unlimited location gets exactly the same requests, so the two differ only in the module.
--
-- done() prints one machine-readable line that bench/run.sh parses:
--   BENCH requests=.. duration_us=.. rps=.. p50_us=.. p99_us=.. non2xx=.. socket_errors=..

local next_thread = 1

function setup(thread)
    thread:set("thread_no", next_thread)
    next_thread = next_thread + 1
end

function init(args)
    consumers = tonumber(args[1] or "") or 10000
    -- Threads start at different offsets of the same id space.
    n = ((thread_no or 1) - 1) * 7919
end

function request()
    n = n + 1
    return wrk.format(nil, nil, { ["X-Consumer-Id"] = "bench-" .. (n % consumers) })
end

function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        "BENCH requests=%d duration_us=%d rps=%.1f p50_us=%d p99_us=%d non2xx=%d socket_errors=%d\n",
        summary.requests, summary.duration, summary.requests / (summary.duration / 1e6),
        latency:percentile(50), latency:percentile(99), e.status,
        e.connect + e.read + e.write + e.timeout))
end
