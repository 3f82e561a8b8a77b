-- ack.lua: IN-FLIGHT -> DONE for a batch of leased requests.
-- KEYS, ARGV[1..3]: see lib.lua.
-- ARGV[4..]: pairs (id, token).
-- A request no longer held under that token (its lease expired and it was handed out
-- again, or it was already acked) is left alone.
-- Returns one character per pair: "1" acked, "0" stale.
local ids, tokens = {}, {}
for i = 4, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
  tokens[#tokens + 1] = ARGV[i + 1]
end
local recs = hmget(K_REQ, ids)
local ok, fps, per_lease, flags, seen = {}, {}, {}, {}, {}
for i, id in ipairs(ids) do
  flags[i] = '0'
  local rec = recs[i]
  if rec and not seen[id] then
    local p, _, t = parse(rec)
    if p ~= nil and t ~= '' and t == tokens[i] then
      seen[id] = true
      flags[i] = '1'
      ok[#ok + 1] = id
      if is_fingerprint(id) then fps[#fps + 1] = id end
      per_lease[t] = (per_lease[t] or 0) + 1
    end
  end
end
if #ok > 0 then
  bulk('HDEL', K_REQ, ok)
  if redis.call('EXISTS', K_ERR) == 1 then bulk('HDEL', K_ERR, ok) end
  dd_mark_done(fps)
  for t, n in pairs(per_lease) do lease_release(t, n) end
  redis.call('HINCRBY', K_STATS, 'done', #ok)
end
return table.concat(flags)
