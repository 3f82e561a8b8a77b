-- counts_streams.lua: the conservation terms of a streams crawl in one atomic step.
-- Standalone (no prelude). KEYS[1] stats, KEYS[2] delayed, KEYS[3] dead, KEYS[4..] streams.
-- Returns {accepted, filtered, done, retried, reclaimed, requeued, in_flight, ready,
-- delayed, dead, queued}: the first six as stored (Python checks them: FrontierCore.counts),
-- in_flight (as a string, in their place) = entries pending in the group, ready = the
-- other entries (acked entries are deleted at once, so every entry is one or the other),
-- queued = the stats' "ready" as stored ("0" if absent): with politeness, the requests in
-- the per-key queues (lua/polite.lua), READY too.
local st = redis.call('HMGET', KEYS[1], 'accepted', 'filtered', 'done', 'retried', 'reclaimed',
                      'requeued')
local out = {}
for i = 1, 6 do out[i] = st[i] or '0' end
local len, pending = 0, 0
for i = 4, #KEYS do
  len = len + redis.call('XLEN', KEYS[i])
  local p = redis.pcall('XPENDING', KEYS[i], 'g')
  if type(p) == 'table' and not p.err then pending = pending + tonumber(p[1]) end
end
out[7] = tostring(pending)
out[8] = len - pending
out[9] = redis.call('ZCARD', KEYS[2])
out[10] = redis.call('ZCARD', KEYS[3])
out[11] = redis.call('HGET', KEYS[1], 'ready') or '0'
return out
