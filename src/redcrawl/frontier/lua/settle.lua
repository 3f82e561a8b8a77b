-- settle.lua: a worker's round trip: store the requests its finished requests produced,
-- then acknowledge those finished requests, then lease more — in that order, atomically,
-- so a request is never acknowledged before its children are stored.
-- KEYS, ARGV[1..3]: see lib.lua.
-- ARGV[4] n_push   ARGV[5] n_ack   ARGV[6] lease n (0: no lease)   ARGV[7] worker id
-- ARGV[8] lease ttl (ms)   ARGV[9] max_attempts   ARGV[10] schedule   ARGV[11] limit
-- ARGV[12..]: n_push triples as in push.lua, then n_ack pairs as in ack.lua.
-- Returns {push flags, ack flags, lease list (as lease.lua)}.
local n_push, n_ack, n_lease = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local pushed = op_push(12, n_push, 0)
local acked = op_ack(12 + 3 * n_push, n_ack)
local leased = {}
if n_lease > 0 then
  leased = op_lease(ARGV[7], n_lease, tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10],
                    tonumber(ARGV[11]))
end
return {pushed, acked, leased}
