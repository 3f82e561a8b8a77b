-- lease.lua: hand up to n READY requests to a worker as one lease (see op_lease in ops.lua).
-- KEYS, ARGV[1..4]: see lib.lua.
-- ARGV[5] worker id   ARGV[6] n   ARGV[7] lease ttl (ms)   ARGV[8] max_attempts
-- ARGV[9] weighted-fair schedule   ARGV[10] most leases to reclaim / requests to promote
-- Returns a flat list: token, then id, attempts, record for each request.
return op_lease(ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9],
                tonumber(ARGV[10]))
