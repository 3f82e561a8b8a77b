-- robots_delay.lua: set (or clear) robots.txt's Crawl-delay in the override of one
-- politeness key (prepended: lua/base.lua). Run with robots_put.lua; apart from it because
-- the override is the partition's that owns the key (a partitioned crawl keeps the
-- robots.txt cache at its anchor).
--
-- KEYS[1] polo  HASH politeness key -> JSON object (the override)
-- ARGV[1] the politeness key of the origin's host
-- ARGV[2] Crawl-delay in seconds, already capped; "" when robots.txt gives none
--
-- The override's other fields (set by operators) are kept as they are; `crawl_delay` is
-- set, or removed when robots.txt has none (the key's field is deleted when nothing is
-- left). An override that is not a JSON object is left alone.
--
-- Returns 1 written, 0 unchanged, -1 not a JSON object (left alone).
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local override = {}
if raw then
  local ok, decoded = pcall(cjson.decode, raw)
  if not ok or type(decoded) ~= 'table' or decoded[1] ~= nil then
    return -1
  end
  override = decoded
end
if ARGV[2] == '' then
  if override['crawl_delay'] == nil then
    return 0
  end
  override['crawl_delay'] = nil
else
  override['crawl_delay'] = tonumber(ARGV[2])
end
if next(override) == nil then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(override))
end
return 1
