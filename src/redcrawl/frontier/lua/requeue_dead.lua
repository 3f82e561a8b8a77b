-- requeue_dead.lua: DEAD -> READY (operator action); attempts start again from zero.
-- KEYS, ARGV[1..4]: see lib.lua.
-- ARGV[5] call nonce (see call_replay in ops.lua; the call has no worker)
-- ARGV[6] "*" to requeue up to ARGV[7] dead requests (oldest first), else "ids" and
-- ARGV[7..] the ids. Returns the number requeued.
local nonce = ARGV[5]
local replay = call_replay('', nonce)
if replay then return tonumber(replay[1]) end
local ids = {}
if ARGV[6] == '*' then
  ids = redis.call('ZRANGE', K_DEAD, 0, tonumber(ARGV[7]) - 1)
else
  local seen = {}
  for i = 7, #ARGV do
    local id = ARGV[i]
    if not seen[id] and redis.call('ZSCORE', K_DEAD, id) then ids[#ids + 1] = id end
    seen[id] = true
  end
end
if #ids > 0 then
  bulk('ZREM', K_DEAD, ids)
  bulk('HDEL', K_ERR, ids)
  requeue(ids, true)
  redis.call('HINCRBY', K_STATS, 'requeued', #ids)
end
call_record('', nonce, tostring(#ids), '', {})
return #ids
