-- ack.lua: IN-FLIGHT -> DONE for a batch of leases.
-- KEYS, ARGV[1..3]: see lib.lua.
-- ARGV[4..]: triples (id, token, fingerprint or "").
-- A lease whose token no longer matches (it expired and was handed out again, or was
-- already acked) is left alone. Returns one character per lease: "1" acked, "0" stale.
local flags = {}
local done = 0
for i = 4, #ARGV, 3 do
  local id, token, fp = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if owned(id, token) then
    release(id)
    redis.call('HDEL', K_REQ, id)
    redis.call('HDEL', K_ATT, id)
    redis.call('HDEL', K_ERR, id)
    if fp ~= '' then dd_done(fp) end
    done = done + 1
    flags[#flags + 1] = '1'
  else
    flags[#flags + 1] = '0'
  end
end
if done > 0 then redis.call('HINCRBY', K_STATS, 'done', done) end
return table.concat(flags)
