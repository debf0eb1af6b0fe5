-- Prints wrk's summary as one machine-readable line for benches/load/run.sh.
-- Latencies are in microseconds; "status" counts responses that were not 2xx/3xx.
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d max_us=%d connect=%d read=%d write=%d status=%d timeout=%d\n",
    summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), latency.max,
    e.connect, e.read, e.write, e.status, e.timeout))
end
