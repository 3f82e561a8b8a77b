-- renew.lua: worker heartbeat. The worker is alive, and all its leases held, until
-- now + ttl (leases past their own deadline are extended lazily by reclaim_expired).
-- KEYS, ARGV[1..3]: see lib.lua.   ARGV[4] worker id   ARGV[5] ttl (ms)
-- Returns the new heartbeat deadline (ms).
local deadline = NOW + tonumber(ARGV[5])
redis.call('HSET', K_WORKERS, ARGV[4], deadline)
return deadline
