-- release.lua: give leased requests back unprocessed (IN-FLIGHT -> READY, front of their
-- tier), without counting the delivery as an attempt: a worker shutting down cleanly
-- hands back what it prefetched but never started.
-- KEYS, ARGV[1..4]: see lib.lua.
-- ARGV[5] worker id   ARGV[6] call nonce (see call_replay in ops.lua)
-- ARGV[7..]: pairs (id, token). Returns how many were given back (stale ones are skipped).
local worker, nonce = ARGV[5], ARGV[6]
local replay = call_replay(worker, nonce)
if replay then return tonumber(replay[1]) end
local back, held, hrecs, writes, items, seen = 0, {}, {}, {}, {}, {}
for i = 7, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local rec = redis.call('HGET', K_REQ, id)
  local p, a, t, env
  if rec then p, a, t, env = parse(rec) end
  if rec and p == nil and not seen[id] then
    seen[id] = kill_corrupt_held(id, token) or nil
  elseif p ~= nil and not seen[id] and FMT.held(id, t, token) then
    seen[id] = true
    t = token
    a = FMT.cur(a)  -- (see FMT in lib.lua)
    if a > 0 then a = a - 1 end
    local nrec = FMT.left(p, a, token, env)
    writes[#writes + 1] = id; writes[#writes + 1] = nrec
    items[#items + 1] = {id, p, 0, nil, nrec}
    held[#held + 1] = t
    hrecs[#held] = rec
    back = back + 1
  end
end
if back > 0 then
  bulk('HSET', K_REQ, writes)
  ready_push(items, true)
  unhold(held, hrecs)
end
call_record(worker, nonce, tostring(back), '', {})
return back
