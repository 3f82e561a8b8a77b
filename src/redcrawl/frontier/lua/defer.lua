-- defer.lua: a leased request the site pushed back (HTTP 429/503) goes IN-FLIGHT -> READY,
-- at the front of its politeness key's queue, without spending an attempt, and its key is
-- blocked for the whole fleet (its Retry-After, or the backoff delay of the key's failure
-- count); past max_deferrals deferrals of the request, it goes to DEAD with the reason.
-- Crawls with politeness only (see defer_held in lib.lua and polite.lua).
-- KEYS, ARGV[1..4]: see lib.lua.
-- ARGV[5] max_deferrals   ARGV[6] worker id   ARGV[7] call nonce (see call_replay in ops.lua)
-- ARGV[8..]: quads (id, token, reason (the status, e.g. "429"), Retry-After in ms or "").
-- Returns one character per request: "q" deferred, "d" dead, "0" stale (not held).
local max_deferrals, worker, nonce = tonumber(ARGV[5]), ARGV[6], ARGV[7]
if not defer_held then
  return redis.error_reply('defer: this crawl has no fleet-wide politeness (lists backend ' ..
    'with REDCRAWL_POLITENESS); nothing was done')
end
local replay = call_replay(worker, nonce)
if replay then return replay[1] end
local items = {}
for i = 8, #ARGV, 4 do
  items[#items + 1] = {ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])}
end
local flags = defer_held(max_deferrals, items)
call_record(worker, nonce, flags, '', {})
return flags
