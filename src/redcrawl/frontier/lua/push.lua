-- push.lua: dedupe and enqueue a batch of requests, atomically.
-- KEYS, ARGV[1..3]: see lib.lua.
-- ARGV[4..]: triples (record "<priority>|0||<envelope>", fingerprint or "" for no
--            dedupe, priority).
-- A request is a duplicate if its fingerprint is DONE or already stored (READY, DELAYED,
-- IN-FLIGHT or DEAD), earlier in this batch included.
-- Returns a string with one character per request: "1" accepted (now READY), "0" duplicate.
local n = (#ARGV - 3) / 3
local fps = {}
for i = 1, n do
  local fp = ARGV[3 * i + 2]
  if fp ~= '' then fps[#fps + 1] = fp end
end
local done = dd_done_flags(fps)
local seq = redis.call('HINCRBY', K_STATS, 'seq', n) - n
local flags, items, plain = {}, {}, {}
local j = 0
for i = 1, n do
  local rec, fp, priority = ARGV[3 * i + 1], ARGV[3 * i + 2], tonumber(ARGV[3 * i + 3])
  local id
  if fp ~= '' then
    j = j + 1
    if not done[j] and redis.call('HSETNX', K_REQ, fp, rec) == 1 then id = fp end
  else
    id = '#' .. (seq + i)
    plain[#plain + 1] = id; plain[#plain + 1] = rec
  end
  if id then
    items[#items + 1] = {id, priority, seq + i}
    flags[i] = '1'
  else
    flags[i] = '0'
  end
end
if #plain > 0 then bulk('HSET', K_REQ, plain) end
ready_push(items, false)
if #items > 0 then redis.call('HINCRBY', K_STATS, 'accepted', #items) end
if #items < n then redis.call('HINCRBY', K_STATS, 'filtered', n - #items) end
return table.concat(flags)
