-- push.lua: dedupe and enqueue a batch of requests, atomically (see op_push in ops.lua).
-- KEYS, ARGV[1..4]: see lib.lua.
-- ARGV[5] delay (ms; 0: READY now)   ARGV[6] "1": recrawl (DONE is no duplicate)
-- ARGV[7..]: PUSH_STRIDE-tuples (record "<priority>|0||<envelope>", fingerprint or "",
-- priority[, shard]).
-- Returns one character per request: "1" accepted, "0" duplicate.
return op_push(7, (#ARGV - 6) / PUSH_STRIDE, tonumber(ARGV[5]), ARGV[6] == '1')
