-- push.lua: dedupe and enqueue a batch of requests, atomically.
-- KEYS, ARGV[1..3]: see lib.lua.
-- ARGV[4..]: triples (record "<priority>|<envelope>", fingerprint or "" for dont_filter,
--            priority).
-- Returns a string with one character per request: "1" accepted (now READY), "0" duplicate.
local flags = {}
local accepted, filtered = 0, 0
for i = 4, #ARGV, 3 do
  local env, fp, priority = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  if fp ~= '' and not dd_add(fp) then
    filtered = filtered + 1
    flags[#flags + 1] = '0'
  else
    local id = tostring(redis.call('HINCRBY', K_STATS, 'seq', 1))
    redis.call('HSET', K_REQ, id, env)
    ready_push(id, priority, false)
    accepted = accepted + 1
    flags[#flags + 1] = '1'
  end
end
if accepted > 0 then redis.call('HINCRBY', K_STATS, 'accepted', accepted) end
if filtered > 0 then redis.call('HINCRBY', K_STATS, 'filtered', filtered) end
return table.concat(flags)
