-- push.lua: dedupe and enqueue a batch of requests, atomically (see op_push in ops.lua).
-- KEYS, ARGV[1..4]: see lib.lua.
-- ARGV[5] delay (ms; 0: READY now)   ARGV[6] "1": recrawl (DONE is no duplicate)
-- ARGV[7] call nonce (see call_replay in ops.lua; the call has no worker)
-- ARGV[8..]: PUSH_STRIDE-tuples (record "<priority>|0||<envelope>", fingerprint or "",
-- priority[, shard], dedupe member or "", dedupe bucket or "").
-- Returns one character per request: "1" accepted, "0" duplicate.
local nonce = ARGV[7]
local replay = call_replay('', nonce)
if replay then return replay[1] end
local flags = op_push(8, (#ARGV - 7) / PUSH_STRIDE, tonumber(ARGV[5]), ARGV[6] == '1')
call_record('', nonce, flags, '', {})
return flags
