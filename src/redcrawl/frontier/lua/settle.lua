-- settle.lua: a worker's round trip: store the requests its finished requests produced,
-- then acknowledge those finished requests, then lease more — in that order, atomically,
-- so a request is never acknowledged before its children are stored.
-- KEYS, ARGV[1..4]: see lib.lua.
-- ARGV[5] n_push   ARGV[6] n_ack   ARGV[7] lease n (0: no lease)   ARGV[8] worker id
-- ARGV[9] lease ttl (ms)   ARGV[10] max_attempts   ARGV[11] schedule   ARGV[12] limit
-- ARGV[13] call nonce ("" for none; see call_replay in ops.lua)
-- ARGV[14..]: n_push tuples as in push.lua, then n_ack pairs as in ack.lua.
-- Returns {push flags, ack flags, lease list (as lease.lua)}.
local worker, nonce = ARGV[8], ARGV[13]
local replay = call_replay(worker, nonce)
if replay then return replay end
local n_push, n_ack, n_lease = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local pushed = op_push(14, n_push, 0, false)
local acked = op_ack(14 + PUSH_STRIDE * n_push, n_ack)
local leased = {}
if n_lease > 0 then
  leased = op_lease(worker, n_lease, tonumber(ARGV[9]), tonumber(ARGV[10]), ARGV[11],
                    tonumber(ARGV[12]))
end
call_record(worker, nonce, pushed, acked, leased)
return {pushed, acked, leased}
