-- renew.lua: worker heartbeat. The worker is alive, and all its leases held, until
-- now + ttl (leases past their own deadline are extended lazily by reclaim_expired).
-- KEYS, ARGV[1..4]: see lib.lua.   ARGV[5] worker id   ARGV[6] ttl (ms)
-- Returns the new heartbeat deadline (ms).
local deadline = NOW + tonumber(ARGV[6])
redis.call('HSET', K_WORKERS, ARGV[5], deadline)
return deadline
