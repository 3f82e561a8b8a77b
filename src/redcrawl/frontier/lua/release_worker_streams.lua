-- release_worker_streams.lua: end a worker's heartbeat and make all its pending entries
-- expire now (XCLAIM ... IDLE far in the past, JUSTID: the delivery count is kept), so the
-- next lease/maintain call reclaims them and then removes the consumer from the group.
-- KEYS, ARGV[1..4]: see lib.lua and queue_streams.lua.   ARGV[5] worker id
-- Returns the number of requests the worker held.
local worker = ARGV[5]
redis.call('HDEL', K_WORKERS, worker)
calls_forget(worker)
local n = 0
for k = 0, NSTREAMS - 1 do
  local key = skey(k)
  local p = redis.pcall('XPENDING', key, S_GROUP, '-', '+', 1000000, worker)
  if type(p) == 'table' and not p.err and #p > 0 then
    local eids = {}
    for i, e in ipairs(p) do eids[i] = e[1] end
    for i = 1, #eids, CHUNK do
      local args = {'XCLAIM', key, S_GROUP, worker, 0,
                    unpack(eids, i, math.min(i + CHUNK - 1, #eids))}
      args[#args + 1] = 'IDLE'; args[#args + 1] = OFFSET + 100000000000
      args[#args + 1] = 'JUSTID'
      redis.call(unpack(args))
    end
    n = n + #p
  end
end
return n
