-- latency.lua: the enqueue -> DONE latency histogram, kept by the ack step for the whole
-- fleet (after lib.lua, before ops.lua; see redcrawl.frontier.core.script_files).
--
-- Push time: op_push appends PUSH_STAMP to every record it stores, "@" and the push time
-- in milliseconds (server clock), 13 digits: a fixed-width ASCII suffix after the
-- envelope, so that readers that unpack the envelope with cmsgpack are not disturbed
-- (each ASCII byte reads as a small integer after the envelope's map) and
-- redcrawl.frontier.records strips it. The record keeps it through retries, requeues and
-- reclaims: the latency is from the first push to DONE.
--
-- Histogram: fields of the stats hash (KEYS[8]), non-cumulative, bounds in ms:
--   lat:<bound>   requests acked with a latency <= bound (and > the bound before)
--   lat:inf       requests acked later than the last bound
--   lat_sum       sum of their latencies (ms)
-- Records pushed before push stamps existed carry none and are not counted.
-- (redcrawl.metrics.collector.LATENCY_BOUNDS_MS mirrors LAT_BOUNDS.)

local LAT_BOUNDS = {100, 500, 1000, 5000, 10000, 30000, 60000, 300000, 900000, 3600000,
                    14400000, 86400000}
local PUSH_STAMP = '@' .. string.format('%013d', NOW)

-- Add the acked records' latencies (NOW - their push stamp) to the histogram.
local function latency_observe(recs)
  local per, sum, any = {}, 0, false
  for _, rec in ipairs(recs) do
    local at = #rec - 13
    if at > 0 and string.byte(rec, at) == 64 then -- '@'
      local pushed = tonumber(string.sub(rec, at + 1))
      if pushed then
        local ms = math.max(NOW - pushed, 0)
        local field = 'lat:inf'
        for _, b in ipairs(LAT_BOUNDS) do
          if ms <= b then field = 'lat:' .. b; break end
        end
        per[field] = (per[field] or 0) + 1
        sum = sum + ms
        any = true
      end
    end
  end
  if not any then return end
  for field, n in pairs(per) do redis.call('HINCRBY', K_STATS, field, n) end
  redis.call('HINCRBY', K_STATS, 'lat_sum', sum)
end
