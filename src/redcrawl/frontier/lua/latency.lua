-- latency.lua: the enqueue -> DONE latency histogram, kept by the ack step for the whole
-- fleet (after lib.lua, before ops.lua; see redcrawl.frontier.core.script_files).
--
-- Push time: every record stored ends with a push stamp: the byte 127 (DEL, a
-- character text never ends with before 7 such digits) and the push time
-- in milliseconds (server clock) as 7 base-64 digits, each the byte 48 + its value
-- ("0".."o"; 42 bits: good until 2109), 8 bytes in all. op_push appends push_stamp() to
-- each record, unless the settle call's records carry their stamp already: a worker
-- that has seen the server's clock (its replies bound the offset of its own clock, see
-- redcrawl.frontier.grant_clock: within a few milliseconds) stamps them itself
-- (redcrawl.frontier.core.push_stamp), which spares the script a new record-sized
-- string per pushed request. A fixed-width ASCII suffix after
-- the envelope: readers that unpack the envelope with cmsgpack are not disturbed (each
-- ASCII byte reads as a small integer after the envelope's map), and
-- redcrawl.frontier.records strips it. The record keeps it through retries, requeues
-- and reclaims: the latency is from the first push to DONE.
--
-- Histogram: fields of the stats hash (KEYS[8]), non-cumulative, bounds in ms:
--   lat:<bound>   requests acked with a latency <= bound (and > the bound before)
--   lat:inf       requests acked later than the last bound
--   lat_sum       sum of their latencies (ms)
-- Records pushed before push stamps existed carry none and are not counted.
-- (redcrawl.metrics.collector.LATENCY_BOUNDS_MS mirrors LAT_BOUNDS.)

local LAT_BOUNDS = {100, 500, 1000, 5000, 10000, 30000, 60000, 300000, 900000, 3600000,
                    14400000, 86400000}
-- The field names as literals (a number in a concatenation costs a sprintf, ~2.5k
-- instructions, and this file runs at every call: tests/test_lua_prelude.py checks them
-- against LAT_BOUNDS).
local LAT_FIELDS = {'lat:100', 'lat:500', 'lat:1000', 'lat:5000', 'lat:10000', 'lat:30000',
                    'lat:60000', 'lat:300000', 'lat:900000', 'lat:3600000', 'lat:14400000',
                    'lat:86400000'}
-- The push stamp of this call's time (op_push makes it once per call, only when it
-- stores a record).
local function push_stamp()
  local digits, ms = {}, NOW
  for i = 7, 1, -1 do digits[i] = string.char(48 + ms % 64); ms = math.floor(ms / 64) end
  return '\127' .. table.concat(digits)
end

-- The push time (ms) of a record, or nil if it has no stamp. (One string.byte for the
-- whole stamp: this runs for every request acked.)
local function pushed_at(rec)
  local n = #rec
  if n < 8 then return nil end
  local m, d1, d2, d3, d4, d5, d6, d7 = string.byte(rec, n - 7, n)
  if m ~= 127 or d1 < 48 or d1 > 111 or d2 < 48 or d2 > 111 or d3 < 48 or d3 > 111 or
     d4 < 48 or d4 > 111 or d5 < 48 or d5 > 111 or d6 < 48 or d6 > 111 or d7 < 48 or
     d7 > 111 then
    return nil
  end
  return ((((((d1 - 48) * 64 + d2 - 48) * 64 + d3 - 48) * 64 + d4 - 48) * 64 + d5 - 48) * 64
          + d6 - 48) * 64 + d7 - 48
end

local N_BOUNDS = 12  -- #LAT_BOUNDS

-- Add the acked records' latencies (NOW - their push stamp) to the histogram.
local function latency_observe(recs)
  local per, sum, any = {}, 0, false
  for j = 1, #recs do
    local pushed = pushed_at(recs[j])
    if pushed then
      local ms = NOW - pushed
      if ms < 0 then ms = 0 end
      -- (two halves first: a loop step costs ~300 instructions, 12 bounds)
      local field = 'lat:inf'
      for i = (ms <= 10000) and 1 or 6, N_BOUNDS do
        if ms <= LAT_BOUNDS[i] then field = LAT_FIELDS[i]; break end
      end
      per[field] = (per[field] or 0) + 1
      sum = sum + ms
      any = true
    end
  end
  if not any then return end
  per['lat_sum'] = sum
  -- Last writes of the ack: a garbage field (not an integer, or one that would overflow)
  -- must not fail the script after its other writes (Redis does not roll a script back):
  -- such a field starts again from this ack's figure.
  for field, n in pairs(per) do
    local got = redis.pcall('HINCRBY', K_STATS, field, n)
    if type(got) == 'table' and got.err then
      redis.call('HSET', K_STATS, field, n)
      repaired('latency field ' .. field .. ' held a non-integer; restarted at ' .. n)
    end
  end
end
