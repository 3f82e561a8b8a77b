-- requeue_dead.lua: DEAD -> READY (operator action); attempts start again from zero.
-- KEYS, ARGV[1..3]: see lib.lua.
-- ARGV[4] "*" to requeue up to ARGV[5] dead requests (oldest first), else "ids" and
-- ARGV[5..] the ids. Returns the number requeued.
local ids
if ARGV[4] == '*' then
  ids = redis.call('ZRANGE', K_DEAD, 0, tonumber(ARGV[5]) - 1)
else
  ids = {}
  for i = 5, #ARGV do ids[#ids + 1] = ARGV[i] end
end
local n = 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', K_DEAD, id) == 1 then
    redis.call('HDEL', K_ATT, id)
    redis.call('HDEL', K_ERR, id)
    requeue(id)
    n = n + 1
  end
end
if n > 0 then redis.call('HINCRBY', K_STATS, 'requeued', n) end
return n
