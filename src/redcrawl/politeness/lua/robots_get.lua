-- robots_get.lua: the fleet's cached robots.txt of one origin, or the right to fetch it
-- (prepended: lua/base.lua). One call per origin; a worker pipelines several.
--
-- KEYS[1] robots                HASH origin -> entry (msgpack, see politeness/robots.py)
-- KEYS[2] robots:exp            ZSET origin -> when its entry expires (ms, server clock)
-- KEYS[3] robots:lock:<origin>  STRING the token of the worker fetching it
-- ARGV[1] origin (scheme://host:port)
-- ARGV[2] the caller's token
-- ARGV[3] lock time to live (ms)
--
-- Returns {1, entry, ms left}: cached and fresh: use it;
--         {2}: the lock is the caller's (taken now, or already its own): fetch robots.txt
--              and store it with robots_put.lua;
--         {3, ms left on the lock}: another worker is fetching it: ask again later.
local now = server_ms()
local expires = redis.call('ZSCORE', KEYS[2], ARGV[1])
if expires and tonumber(expires) > now then
  local entry = redis.call('HGET', KEYS[1], ARGV[1])
  if entry then
    return {1, entry, tonumber(expires) - now}
  end
end
if redis.call('SET', KEYS[3], ARGV[2], 'NX', 'PX', ARGV[3]) then
  return {2}
end
if redis.call('GET', KEYS[3]) == ARGV[2] then
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
  return {2}
end
return {3, redis.call('PTTL', KEYS[3])}
