-- settle.lua: a worker's round trip: store the requests its finished requests produced,
-- then acknowledge those finished requests, then lease more — in that order, atomically,
-- so a request is never acknowledged before its children are stored.
-- KEYS, ARGV[1..4]: see lib.lua.
-- ARGV[5] n_push   ARGV[6] n_ack   ARGV[7] lease n (0: no lease)   ARGV[8] worker id
-- ("": none)   ARGV[9] lease ttl (ms)   ARGV[10] max_attempts   ARGV[11] schedule
-- ARGV[12] limit   ARGV[13] call nonce (see call_replay in ops.lua)
-- ARGV[14], ARGV[15] worker and nonce of the call before this one in its pipeline ("":
-- none). Settles sent back to back (settle_begin) run in order, but Redis may refuse one
-- (out of memory, a malformed call) and run the next: that one must not acknowledge
-- parents whose children were in the refused call. If the call before it did not run,
-- this call stores and leases but acknowledges nothing (ack flags "2": the caller acks
-- them again once it has stored what the refused call held).
-- ARGV[16] "1": each pushed record ends with its push stamp already (the caller's reading
-- of the time this call runs, see latency.lua), "" : the script appends it.
-- ARGV[17..]: n_push tuples as in push.lua, then n_ack pairs as in ack.lua, then
-- (crawls with politeness) triples as in free.lua, to the end: slots given back at
-- response time, after the acks and before the lease (which may grant them again).
-- Returns {push flags, ack flags, lease list (as lease.lua, without the time), the time of
-- the call (the script's clock, ms: when its grants were made)}; a replayed call (its
-- nonce seen before) returns the first three only (see lease.lua).
local worker, nonce = ARGV[8], ARGV[13]
local n_push, n_ack, n_lease = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local n_free = 0
if n_push and n_ack then n_free = (#ARGV - 16 - PUSH_STRIDE * n_push - 2 * n_ack) / 3 end
if not (n_push and n_ack and n_lease) or n_free < 0 or n_free ~= math.floor(n_free) then
  return redis.error_reply('settle: malformed call (' .. #ARGV .. ' arguments for ' ..
    tostring(ARGV[5]) .. ' pushes and ' .. tostring(ARGV[6]) .. ' acks); nothing was done')
end
local replay = call_replay(worker, nonce)
if replay then return replay end
local refuse = ARGV[15] ~= '' and not call_ran(ARGV[14], ARGV[15])
local pushed = op_push(17, n_push, 0, false, ARGV[16] == '1')
local acked = op_ack(17 + PUSH_STRIDE * n_push, n_ack, refuse)
op_free(17 + PUSH_STRIDE * n_push + 2 * n_ack, n_free)
local leased = {}
if n_lease > 0 then
  leased = op_lease(worker, n_lease, tonumber(ARGV[9]), tonumber(ARGV[10]), ARGV[11],
                    tonumber(ARGV[12]))
end
call_record(worker, nonce, pushed, acked, leased, refuse)
return {pushed, acked, leased, NOW}
