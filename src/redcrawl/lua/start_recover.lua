-- start_recover.lua: claims of RedisSpider workers that stopped (start_claim.lua) go back
-- to the start key, so that another worker reads their entries again. The caller picks
-- the claims (those of workers whose heartbeat has ended: the frontier's workers hash is
-- in another slot); a claim already cleared or given back is skipped. Prepended:
-- lua/base.lua.
--
-- KEYS[1] the start key  LIST, SET or ZSET (ARGV[1])
-- KEYS[2] its claims     HASH "<worker>#<seq>" -> msgpack array of entries; same slot
-- ARGV[1] the start key's type: list, set or zset
-- ARGV[2..] the claims' fields, newest first
--
-- A LIST gets each claim's entries back at its head, in their order, the oldest claim's
-- first (as if never taken); a SET its members; a ZSET its members with their scores,
-- unless the member is there again (ZADD NX: a score pushed since wins).
--
-- Returns the number of entries given back.
local back = 0
for i = 2, #ARGV do
  local packed = redis.call('HGET', KEYS[2], ARGV[i])
  if packed then
    local entries = cmsgpack.unpack(packed)
    if ARGV[1] == 'zset' then
      for j = 1, #entries, 2 do
        redis.call('ZADD', KEYS[1], 'NX', entries[j + 1], entries[j])
      end
      back = back + #entries / 2
    else
      if ARGV[1] == 'list' then
        local reversed = {}
        for j = #entries, 1, -1 do
          reversed[#reversed + 1] = entries[j]
        end
        bulk('LPUSH', KEYS[1], reversed)
      else
        bulk('SADD', KEYS[1], entries)
      end
      back = back + #entries
    end
    redis.call('HDEL', KEYS[2], ARGV[i])
  end
end
return back
