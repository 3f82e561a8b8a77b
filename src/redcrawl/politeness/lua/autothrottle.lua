-- autothrottle.lua: Scrapy's AutoThrottle update rule applied to the fleet-wide delay of
-- politeness keys (prepended: lua/base.lua), one update per response, in order.
--
-- KEYS[1] pol   the base of the keys' state hashes (redcrawl.keys.CrawlKeys.pol_state_base;
--               the state of key K is the HASH KEYS[1] .. K, as the frontier's lease step
--               reads it). The rule's state is its field `ad`: the delay in milliseconds
--               ("%.17g", so that seconds come back exactly as ms / 1000), next to the
--               lease step's fields (in, next, block, ...), which are kept as they are.
-- ARGV[1] target concurrency (AUTOTHROTTLE_TARGET_CONCURRENCY, > 0)
-- ARGV[2] the smallest delay, seconds (DOWNLOAD_DELAY)
-- ARGV[3] the largest delay, seconds (AUTOTHROTTLE_MAX_DELAY)
-- ARGV[4] the delay of a key without `ad`, seconds (max(DOWNLOAD_DELAY,
--         AUTOTHROTTLE_START_DELAY): Scrapy's new slot)
-- ARGV[5], ARGV[6], ARGV[7], then the same for the next response...:
--         politeness key, download latency (seconds), HTTP status
--
-- The rule (scrapy.extensions.throttle.AutoThrottle._adjust_delay, Scrapy 2.11-2.19):
--   target = latency / target concurrency
--   new = max(target, (old + target) / 2), then clamped to [smallest, largest]
--   a response other than 200 never lowers the delay (new <= old: nothing changes)
-- A stored `ad` that is not a number >= 0 counts as absent (ARGV[4]).
--
-- A delay that does not change is not written (a key without `ad` that stays at ARGV[4]
-- gets no entry). The state hash expires as the lease step makes it expire: with nothing
-- in flight, an hour (IDLE_TTL, as in frontier/lua/queue_lists.lua) after the later of its
-- `next` and `block`; so a key's AutoThrottle delay is forgotten with the rest of its
-- state once the key is idle (it starts again from ARGV[4]).
--
-- Returns, per response, three values: 1 written / 0 unchanged; the old delay and the new
-- one, as strings ("%.17g", seconds).
local IDLE_TTL = 3600000
local target_conc = tonumber(ARGV[1])
local low = tonumber(ARGV[2])
local high = tonumber(ARGV[3])
local start = tonumber(ARGV[4])
local now = server_ms()

local function fmt(x)
  return string.format('%.17g', x)
end

local out = {}
for i = 5, #ARGV, 3 do
  local state = KEYS[1] .. ARGV[i]
  local latency = tonumber(ARGV[i + 1])
  local status = tonumber(ARGV[i + 2])
  local old = tonumber(redis.call('HGET', state, 'ad') or '')
  if old == nil or old ~= old or old < 0 or old == math.huge then
    old = start
  else
    old = old / 1000
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
    redis.call('HSET', state, 'ad', fmt(new * 1000))
    local v = redis.call('HMGET', state, 'in', 'next', 'block')
    if (tonumber(v[1]) or 0) <= 0 then
      local until_ms = math.max(tonumber(v[2]) or 0, tonumber(v[3]) or 0)
      redis.call('PEXPIRE', state, math.max(until_ms - now, 0) + IDLE_TTL)
    end
    out[#out + 1] = 1
    out[#out + 1] = fmt(old)
    out[#out + 1] = fmt(new)
  end
end
return out
