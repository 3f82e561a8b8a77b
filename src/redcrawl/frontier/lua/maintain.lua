-- maintain.lua: promote due DELAYED requests and reclaim expired leases, without leasing.
-- KEYS, ARGV[1..3]: see lib.lua.   ARGV[4] max_attempts   ARGV[5] limit
-- Returns {promoted, reclaimed}.
local max_attempts, limit = tonumber(ARGV[4]), tonumber(ARGV[5])
return {promote_due(limit), reclaim_expired(limit, max_attempts)}
