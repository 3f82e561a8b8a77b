-- release_worker.lua: end a worker's heartbeat and make all its leases expire now, so the
-- next lease/maintain call reclaims them (operator "force reclaim", or a clean shutdown).
-- KEYS, ARGV[1..4]: see lib.lua.   ARGV[5] worker id
-- Returns the number of requests those leases still hold (expire_worker, the queue
-- layer's).
local worker = ARGV[5]
redis.call('HDEL', K_WORKERS, worker)
calls_forget(worker)
return expire_worker(worker)
