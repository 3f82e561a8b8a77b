-- lease.lua: hand up to n READY requests to a worker as one lease (see op_lease in ops.lua).
-- KEYS, ARGV[1..3]: see lib.lua.
-- ARGV[4] worker id   ARGV[5] n   ARGV[6] lease ttl (ms)   ARGV[7] max_attempts
-- ARGV[8] weighted-fair schedule   ARGV[9] most leases to reclaim / requests to promote
-- Returns a flat list: token, then id, attempts, record for each request.
return op_lease(ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8],
                tonumber(ARGV[9]))
