-- hosts_override.lua: an operator's change to the override of one politeness key (API
-- PUT/DELETE /v1/crawls/{crawl}/hosts/{key}, `redcrawl hosts set/block/unblock/reset`),
-- merged into the key's JSON object in one step, and the key made to be looked at again
-- by the next lease (prepended: lua/base.lua).
--
-- KEYS[1]    polo   HASH politeness key -> JSON object (the override; robots.txt's
--                   `crawl_delay` lives there too; AutoThrottle's delay is the state's `ad`)
-- KEYS[2]    pol:   key base of the per-key state: pol:<key> HASH in, next, block, ...
-- KEYS[3..]  open:<t>, one per tier: ZSET politeness key -> when it may next be granted
-- ARGV[1] the politeness key
-- ARGV[2] "set": ARGV[3]'s fields are set, ARGV[4]'s removed; "reset": every operator
--         field (delay, concurrency, block_until, paused) removed, the rest kept
-- ARGV[3] JSON object of fields to set ("set")
-- ARGV[4] fields to remove, comma-separated ("set"; may be empty)
-- ARGV[5] block for this many ms from now (sets block_until), or ""
-- ARGV[6] the key's delay (ms) after the change, or "": its next allowed grant is brought
--         down to at most now + this (a lowered delay counts from now, not from the
--         last grant charged with the old one)
-- ARGV[7] now (ms), or "" for the server's clock (tests pass theirs, as the frontier's)
--
-- Then every tier's open zset where the key is (it has ready requests there) gets a
-- score of at most now: the lease step finds it at the head, checks it against its new
-- limits and grants it or rescores it where it belongs (a key scored by an old block,
-- delay or a full set of slots would otherwise wait for that old time). A key with no
-- ready requests is in no open zset and is not added.
--
-- An override that is not a JSON object is replaced by the operator's fields alone.
-- Returns {the stored JSON ("" when the key's field was deleted), 1 if an unreadable
-- override was replaced else 0}.
local key = ARGV[1]
local now = tonumber(ARGV[7]) or server_ms()

local override, replaced = {}, 0
local raw = redis.call('HGET', KEYS[1], key)
if raw then
  local ok, decoded = pcall(cjson.decode, raw)
  if ok and type(decoded) == 'table' and decoded[1] == nil then
    override = decoded
  else
    replaced = 1
  end
end

if ARGV[2] == 'reset' then
  for _, f in ipairs({'delay', 'concurrency', 'block_until', 'paused'}) do override[f] = nil end
else
  for f, v in pairs(cjson.decode(ARGV[3])) do override[f] = v end
  for f in string.gmatch(ARGV[4], '[^,]+') do override[f] = nil end
  if ARGV[5] ~= '' then override['block_until'] = now + tonumber(ARGV[5]) end
end

local stored = ''
if next(override) == nil then
  redis.call('HDEL', KEYS[1], key)
else
  stored = cjson.encode(override)
  redis.call('HSET', KEYS[1], key, stored)
end

if ARGV[6] ~= '' then
  local state = KEYS[2] .. key
  local nxt = tonumber(redis.call('HGET', state, 'next') or '')
  local cap = now + tonumber(ARGV[6])
  if nxt and nxt > cap then redis.call('HSET', state, 'next', cap) end
end

for i = 3, #KEYS do
  redis.call('ZADD', KEYS[i], 'XX', 'LT', now, key)
end
return {stored, replaced}
