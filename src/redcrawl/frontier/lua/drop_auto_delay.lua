-- drop_auto_delay.lua: one step of removing AutoThrottle's delay of crawls created before
-- it moved into the key's state (field "ad" of K_POL .. key): such crawls may still hold
-- "auto_delay" (seconds) in a key's override JSON in K_POLO, which no step reads any more
-- (docs/politeness.md, "AutoThrottle, fleet-wide"), never expires and makes every grant
-- read the override hash (ANY_OVERRIDES). Crawls with politeness (lists backend) only.
-- KEYS, ARGV[1..4]: see lib.lua.
-- ARGV[5] HSCAN cursor of K_POLO ("0" to start)   ARGV[6] HSCAN COUNT
-- For each entry scanned: a JSON object with "auto_delay" loses that field (written back
-- re-encoded, or deleted when nothing else is left); anything else is left as it is (an
-- operator's or robots.txt's fields, an unreadable value: the lease step ignores those).
-- Returns {next cursor ("0": done), entries changed}.
if not POLITE then return {'0', 0} end
local scan = redis.call('HSCAN', K_POLO, ARGV[5], 'COUNT', tonumber(ARGV[6]))
local entries, changed = scan[2], 0
for i = 1, #entries, 2 do
  local key, raw = entries[i], entries[i + 1]
  local ok, v = pcall(cjson.decode, raw)
  if ok and type(v) == 'table' and v.auto_delay ~= nil then
    v.auto_delay = nil
    if next(v) == nil then
      redis.call('HDEL', K_POLO, key)
    else
      redis.call('HSET', K_POLO, key, cjson.encode(v))
    end
    changed = changed + 1
  end
end
return {scan[1], changed}
