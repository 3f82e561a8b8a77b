-- ack.lua: IN-FLIGHT -> DONE for a batch of leased requests (see op_ack in ops.lua).
-- KEYS, ARGV[1..4]: see lib.lua.   ARGV[5..]: pairs (id, token).
-- Returns one character per pair: "1" acked, "0" stale.
return op_ack(5, (#ARGV - 4) / 2)
