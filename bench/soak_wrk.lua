-- wrk script for bench/soak.sh: the mixed traffic of the soak test.
--
-- Arguments (after `--`): IDS HOT_IDS
--   IDS      rotating consumer ids "c-0" .. "c-<IDS-1>", each far below its limit
--   HOT_IDS  over-limit consumers "hot-0" .. "hot-<HOT_IDS-1>" (10 % of the requests)
--
-- The mix, per 100 requests (spread evenly, the same in every second of the run):
--   70  GET /api/     rotating id                       zone api (sliding_log)
--   10  GET /api/     hot id: far over its limit        REJECTED, then REJECTED_CACHED
--    9  GET /lease/   busy id (4 of them), over 200/10s zone leased (lease=auto): PASSED_LEASE
--    1  GET /conc/    busy id (3 of them), ~1 s each    zone conc (4 in flight per id)
--    5  GET /gcra/    rotating id                       zone pace (gcra)
--    3  GET /search/  rotating id, cost=5, two zones    zones api (cost 5) + daily (sliding_counter)
--    2  GET /quota/   rotating id, cost=0               reads zone api, records nothing
--
-- done() prints one line that soak.sh parses:
--   SOAK requests=.. duration_us=.. rps=.. p50_us=.. p99_us=.. non2xx=.. socket_errors=..

local next_thread = 1

function setup(thread)
    thread:set("thread_no", next_thread)
    next_thread = next_thread + 1
end

function init(args)
    ids = tonumber(args[1] or "") or 5000
    hot_ids = tonumber(args[2] or "") or 5
    if hot_ids < 1 then hot_ids = 1 end
    -- Threads start at different offsets so they do not send the same id at once.
    k = ((thread_no or 1) - 1) * 7919
    n = 0
end

local function id()
    k = k + 1
    return "c-" .. (k % ids)
end

function request()
    n = n + 1
    local slot = n % 100
    if slot < 70 then
        return wrk.format("GET", "/api/index.html", { ["X-Consumer-Id"] = id() })
    elseif slot < 79 then
        return wrk.format("GET", "/lease/index.html", { ["X-Consumer-Id"] = "busy-" .. (n % 4) })
    elseif slot < 80 then
        return wrk.format("GET", "/conc/index.html", { ["X-Consumer-Id"] = "slow-" .. (n % 3) })
    elseif slot < 90 then
        return wrk.format("GET", "/api/index.html", { ["X-Consumer-Id"] = "hot-" .. (n % hot_ids) })
    elseif slot < 95 then
        return wrk.format("GET", "/gcra/index.html", { ["X-Consumer-Id"] = id() })
    elseif slot < 98 then
        return wrk.format("GET", "/search/index.html", { ["X-Consumer-Id"] = id() })
    else
        return wrk.format("GET", "/quota/index.html", { ["X-Consumer-Id"] = id() })
    end
end

function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        "SOAK requests=%d duration_us=%d rps=%.1f p50_us=%d p99_us=%d non2xx=%d socket_errors=%d\n",
        summary.requests, summary.duration, summary.requests / (summary.duration / 1e6),
        latency:percentile(50), latency:percentile(99), e.status,
        e.connect + e.read + e.write + e.timeout))
end
