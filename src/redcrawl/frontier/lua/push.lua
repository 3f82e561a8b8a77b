-- push.lua: dedupe and enqueue a batch of requests, atomically (see op_push in ops.lua).
-- KEYS, ARGV[1..3]: see lib.lua.
-- ARGV[4] delay (ms; 0: READY now)
-- ARGV[5..]: triples (record "<priority>|0||<envelope>", fingerprint or "", priority).
-- Returns one character per request: "1" accepted, "0" duplicate.
return op_push(5, (#ARGV - 4) / 3, tonumber(ARGV[4]))
