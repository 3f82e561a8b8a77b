-- requeue_dead.lua: DEAD -> READY (operator action); attempts start again from zero.
-- KEYS, ARGV[1..4]: see lib.lua.
-- ARGV[5] "*" to requeue up to ARGV[6] dead requests (oldest first), else "ids" and
-- ARGV[6..] the ids. Returns the number requeued.
local ids = {}
if ARGV[5] == '*' then
  ids = redis.call('ZRANGE', K_DEAD, 0, tonumber(ARGV[6]) - 1)
else
  local seen = {}
  for i = 6, #ARGV do
    local id = ARGV[i]
    if not seen[id] and redis.call('ZSCORE', K_DEAD, id) then ids[#ids + 1] = id end
    seen[id] = true
  end
end
if #ids == 0 then return 0 end
bulk('ZREM', K_DEAD, ids)
bulk('HDEL', K_ERR, ids)
requeue(ids, true)
redis.call('HINCRBY', K_STATS, 'requeued', #ids)
return #ids
