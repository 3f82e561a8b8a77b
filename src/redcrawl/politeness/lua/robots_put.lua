-- robots_put.lua: store one origin's robots.txt for the fleet, release the caller's lock
-- on it, and set (or clear) the Crawl-delay of its politeness key (prepended: lua/base.lua).
--
-- KEYS[1] robots                HASH origin -> entry
-- KEYS[2] robots:exp            ZSET origin -> when its entry expires (ms, server clock)
-- KEYS[3] robots:bytes          STRING the bytes of every entry in KEYS[1]
-- KEYS[4] robots:lock:<origin>  STRING the token of the worker fetching it
-- KEYS[5] polo                  HASH politeness key -> JSON object (the override)
-- ARGV[1] origin
-- ARGV[2] entry
-- ARGV[3] its time to live (ms)
-- ARGV[4] the caller's token (the lock is deleted only if it holds this token)
-- ARGV[5] bound on the bytes of all entries
-- ARGV[6] the politeness key of the origin's host
-- ARGV[7] Crawl-delay in seconds, already capped; "" when robots.txt gives none
--
-- Expired entries (up to 100 per call) go first; then, while the new entry does not fit
-- under ARGV[5], the entries closest to expiry. An entry larger than ARGV[5] on its own
-- is not stored. The override's other fields (set by operators) are kept as they are;
-- `crawl_delay` is set, or removed when robots.txt has none (the key's field is deleted
-- when nothing is left). An override that is not a JSON object is left alone.
--
-- Returns {stored (1/0), entries evicted to make room, override: 1 written, 0 unchanged,
-- -1 not a JSON object (left alone)}.
local now = server_ms()
local origin = ARGV[1]

local function drop(o)
  local size = redis.call('HSTRLEN', KEYS[1], o)
  redis.call('HDEL', KEYS[1], o)
  redis.call('ZREM', KEYS[2], o)
  if size > 0 then
    redis.call('DECRBY', KEYS[3], size)
  end
end

for _, o in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 100)) do
  drop(o)
end
drop(origin)
if redis.call('HLEN', KEYS[1]) == 0 then
  redis.call('SET', KEYS[3], 0)  -- nothing cached: nothing counted (repairs any drift)
end

local size = #ARGV[2]
local bound = tonumber(ARGV[5])
local stored, evicted = 0, 0
if size <= bound then
  while tonumber(redis.call('GET', KEYS[3]) or '0') + size > bound do
    local first = redis.call('ZRANGE', KEYS[2], 0, 0)
    if #first == 0 then
      break
    end
    drop(first[1])
    evicted = evicted + 1
  end
  redis.call('HSET', KEYS[1], origin, ARGV[2])
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), origin)
  redis.call('INCRBY', KEYS[3], size)
  stored = 1
end

if redis.call('GET', KEYS[4]) == ARGV[4] then
  redis.call('DEL', KEYS[4])
end

local raw = redis.call('HGET', KEYS[5], ARGV[6])
local override = {}
if raw then
  local ok, decoded = pcall(cjson.decode, raw)
  if not ok or type(decoded) ~= 'table' or decoded[1] ~= nil then
    return {stored, evicted, -1}
  end
  override = decoded
end
if ARGV[7] == '' then
  if override['crawl_delay'] == nil then
    return {stored, evicted, 0}
  end
  override['crawl_delay'] = nil
else
  override['crawl_delay'] = tonumber(ARGV[7])
end
if next(override) == nil then
  redis.call('HDEL', KEYS[5], ARGV[6])
else
  redis.call('HSET', KEYS[5], ARGV[6], cjson.encode(override))
end
return {stored, evicted, 1}
