-- lease.lua: hand up to n READY requests to a worker as one lease (see op_lease in ops.lua).
-- KEYS, ARGV[1..4]: see lib.lua.
-- ARGV[5] worker id   ARGV[6] n   ARGV[7] lease ttl (ms)   ARGV[8] max_attempts
-- ARGV[9] weighted-fair schedule   ARGV[10] most leases to reclaim / requests to promote
-- ARGV[11] call nonce ("" for none; see call_replay in ops.lua)
-- Returns the lease reply: id, attempts, record, token of each leased request, in one
-- flat list (both backends), then the time of the grant (the script's clock, ms: what the
-- politeness delay was charged from). A replayed call (its nonce seen before) returns the
-- list without the time: the caller then knows only that the grant came after it sent
-- the call.
local worker, nonce = ARGV[5], ARGV[11]
local replay = call_replay(worker, nonce)
if replay then return replay[3] end
local leased = op_lease(worker, tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]),
                        ARGV[9], tonumber(ARGV[10]))
call_record(worker, nonce, '', '', leased)
leased[#leased + 1] = NOW
return leased
