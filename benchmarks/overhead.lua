-- wrk script of benchmarks/overhead.py: POST /search with one JSON body per line of $QUERIES_FILE, in turn,
-- Cache-Control: no-cache; prints one line "WRKJSON {...}" with the counts and latency percentiles.
local bodies = {}
for line in io.lines(os.getenv("QUERIES_FILE")) do bodies[#bodies + 1] = line end
local i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Cache-Control"] = "no-cache"

request = function()
  i = i + 1
  return wrk.format(nil, "/search", nil, bodies[(i % #bodies) + 1])
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRKJSON {"requests": %d, "duration_us": %d, "connect_errors": %d, "read_errors": %d, '
    .. '"write_errors": %d, "non_2xx": %d, "timeouts": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, '
    .. '"mean_us": %.1f}\n', summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean))
end
