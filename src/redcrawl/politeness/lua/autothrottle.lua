-- autothrottle.lua: Scrapy's AutoThrottle update rule applied to the fleet-wide delay of
-- politeness keys (prepended: lua/base.lua), one update per response, in order.
--
-- KEYS[1] polo  HASH politeness key -> JSON object (the override); the rule's state is its
--               field `auto_delay` (seconds), next to the operators' fields and robots.txt's
--               `crawl_delay`, which are kept as they are
-- ARGV[1] target concurrency (AUTOTHROTTLE_TARGET_CONCURRENCY, > 0)
-- ARGV[2] the smallest delay, seconds (DOWNLOAD_DELAY)
-- ARGV[3] the largest delay, seconds (AUTOTHROTTLE_MAX_DELAY)
-- ARGV[4] the delay of a key without `auto_delay`, seconds (max(DOWNLOAD_DELAY,
--         AUTOTHROTTLE_START_DELAY): Scrapy's new slot)
-- ARGV[5], ARGV[6], ARGV[7], then the same for the next response...:
--         politeness key, download latency (seconds), HTTP status
--
-- The rule (scrapy.extensions.throttle.AutoThrottle._adjust_delay, Scrapy 2.11-2.19):
--   target = latency / target concurrency
--   new = max(target, (old + target) / 2), then clamped to [smallest, largest]
--   a response other than 200 never lowers the delay (new <= old: nothing changes)
-- A stored `auto_delay` that is not a number >= 0 counts as absent (ARGV[4]). An override
-- that is not a JSON object is left alone (-1). The JSON keeps 14 significant digits
-- (cjson), so the next update starts from the stored value rounded that way.
--
-- A delay that does not change is not written (a key without `auto_delay` that stays at
-- ARGV[4] gets no entry).
--
-- Returns, per response, three values: 1 written / 0 unchanged / -1 override not a JSON
-- object; the old delay and the new one, as strings ("%.17g", seconds).
local target_conc = tonumber(ARGV[1])
local low = tonumber(ARGV[2])
local high = tonumber(ARGV[3])
local start = tonumber(ARGV[4])

local function fmt(x)
  return string.format('%.17g', x)
end

local out = {}
for i = 5, #ARGV, 3 do
  local key = ARGV[i]
  local latency = tonumber(ARGV[i + 1])
  local status = tonumber(ARGV[i + 2])
  local raw = redis.call('HGET', KEYS[1], key)
  local override = {}
  local ok = true
  if raw then
    local good, decoded = pcall(cjson.decode, raw)
    if not good or type(decoded) ~= 'table' or decoded[1] ~= nil then
      ok = false
    else
      override = decoded
    end
  end
  if not ok then
    out[#out + 1] = -1
    out[#out + 1] = ''
    out[#out + 1] = ''
  else
    local old = override['auto_delay']
    if type(old) ~= 'number' or old ~= old or old < 0 or old == math.huge then
      old = start
    end
    local target = latency / target_conc
    local new = (old + target) / 2.0
    new = math.max(target, new)
    new = math.min(math.max(low, new), high)
    if new == old or (status ~= 200 and new <= old) then
      out[#out + 1] = 0
      out[#out + 1] = fmt(old)
      out[#out + 1] = fmt(old)
    else
      override['auto_delay'] = new
      redis.call('HSET', KEYS[1], key, cjson.encode(override))
      out[#out + 1] = 1
      out[#out + 1] = fmt(old)
      out[#out + 1] = fmt(new)
    end
  end
end
return out
