-- ack.lua: IN-FLIGHT -> DONE for a batch of leased requests (see op_ack in ops.lua).
-- KEYS, ARGV[1..3]: see lib.lua.   ARGV[4..]: pairs (id, token).
-- Returns one character per pair: "1" acked, "0" stale.
return op_ack(4, (#ARGV - 3) / 2)
