-- robots_put.lua: store one origin's robots.txt for the fleet and release the caller's
-- lock on it (prepended: lua/base.lua). The Crawl-delay goes to the site's politeness
-- override with robots_delay.lua, in the same round (a MULTI where both are in one slot).
--
-- KEYS[1] robots                HASH origin -> entry
-- KEYS[2] robots:exp            ZSET origin -> when its entry expires (ms, server clock)
-- KEYS[3] robots:bytes          STRING the bytes of every entry in KEYS[1]
-- KEYS[4] robots:lock:<origin>  STRING the token of the worker fetching it
-- ARGV[1] origin
-- ARGV[2] entry
-- ARGV[3] its time to live (ms)
-- ARGV[4] the caller's token (the lock is deleted only if it holds this token)
-- ARGV[5] bound on the bytes of all entries
--
-- Expired entries (up to 100 per call) go first; then, while the new entry does not fit
-- under ARGV[5], the entries closest to expiry. An entry larger than ARGV[5] on its own
-- is not stored.
--
-- Returns {stored (1/0), entries evicted to make room}.
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

return {stored, evicted}
