-- release.lua: give leased requests back unprocessed (IN-FLIGHT -> READY, front of their
-- tier), without counting the delivery as an attempt: a worker shutting down cleanly
-- hands back what it prefetched but never started.
-- KEYS, ARGV[1..4]: see lib.lua.
-- ARGV[5..]: pairs (id, token). Returns how many were given back (stale ones are skipped).
local back, per_lease, writes, items, seen = 0, {}, {}, {}, {}
for i = 5, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local rec = redis.call('HGET', K_REQ, id)
  local p, a, t, env
  if rec then p, a, t, env = parse(rec) end
  if p ~= nil and t ~= '' and t == token and not seen[id] then
    seen[id] = true
    if a > 0 then a = a - 1 end
    writes[#writes + 1] = id; writes[#writes + 1] = header(p, a, '', env)
    items[#items + 1] = {id, p, 0}
    per_lease[t] = (per_lease[t] or 0) + 1
    back = back + 1
  end
end
if back > 0 then
  bulk('HSET', K_REQ, writes)
  ready_push(items, true)
  for t, n in pairs(per_lease) do lease_release(t, n) end
end
return back
