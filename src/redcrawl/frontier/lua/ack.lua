-- ack.lua: IN-FLIGHT -> DONE for a batch of leases.
-- KEYS, ARGV[1..3]: see lib.lua.
-- ARGV[4..]: pairs (id, token).
-- A lease whose token no longer matches (it expired and was handed out again, or was
-- already acked) is left alone. Returns one character per lease: "1" acked, "0" stale.
local ids, tokens = {}, {}
for i = 4, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
  tokens[#tokens + 1] = ARGV[i + 1]
end
local ok = owned(ids, tokens)
local acked = {}
if #ok > 0 then
  release(ok)
  bulk('HDEL', K_REQ, ok)
  bulk('HDEL', K_ATT, ok)
  bulk('HDEL', K_ERR, ok)
  local fps = {}
  for _, id in ipairs(ok) do
    acked[id] = true
    if is_fingerprint(id) then fps[#fps + 1] = id end
  end
  dd_mark_done(fps)
  redis.call('HINCRBY', K_STATS, 'done', #ok)
end
local flags = {}
for i, id in ipairs(ids) do
  if acked[id] then
    flags[i] = '1'
    acked[id] = nil -- the same lease twice in one batch counts once
  else
    flags[i] = '0'
  end
end
return table.concat(flags)
