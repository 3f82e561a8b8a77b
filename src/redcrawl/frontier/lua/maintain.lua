-- maintain.lua: promote due DELAYED requests and reclaim expired leases, without leasing.
-- KEYS, ARGV[1..4]: see lib.lua.   ARGV[5] max_attempts   ARGV[6] limit
-- ARGV[7] lease ttl (ms; the streams layer's claim threshold, unused by lists)
-- Returns {promoted, reclaimed}.
local max_attempts, limit = tonumber(ARGV[5]), tonumber(ARGV[6])
return {promote_due(limit), reclaim_expired(limit, max_attempts, tonumber(ARGV[7]))}
