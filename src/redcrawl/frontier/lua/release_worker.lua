-- release_worker.lua: end a worker's heartbeat and make all its leases expire now, so the
-- next lease/maintain call reclaims them (operator "force reclaim", or a clean shutdown).
-- KEYS, ARGV[1..4]: see lib.lua.   ARGV[5] worker id
-- Returns the number of requests those leases still hold. Scans the leases hash: an
-- operator action, not a hot path.
local worker = ARGV[5]
redis.call('HDEL', K_WORKERS, worker)
calls_forget(worker)
local n = 0
local cursor = '0'
repeat
  local r = redis.call('HSCAN', K_LEASES, cursor, 'COUNT', 1000)
  cursor = r[1]
  local kv = r[2]
  for i = 1, #kv, 2 do
    local _, w = lease_info(kv[i])
    if w == worker then
      redis.call('ZADD', K_INFLIGHT, 0, kv[i])
      n = n + math.max(num(redis.call('HGET', K_LEFT, kv[i])), 0)
    end
  end
until cursor == '0'
return n
