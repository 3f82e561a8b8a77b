-- counts_lists.lua: the conservation terms of a lists crawl in one atomic step, for the
-- partitions of a partitioned crawl, read in one pipelined round (frontier/partitioned.py),
-- and for a crawl of one partition (ListsFrontier._count_states: not a MULTI, which a Redis
-- out of memory refuses, reads included).
-- Standalone (no prelude). KEYS[1] stats, KEYS[2] delayed, KEYS[3] dead, KEYS[4..] the
-- ready tiers (none with politeness). ARGV[1] "polite" (ready is the stats counter
-- "ready"), "list" (the tiers are LISTs: fifo, lifo) or "zset" (priority).
-- Returns {accepted, filtered, done, retried, reclaimed, requeued, inflight, ready,
-- delayed, dead}: the first seven as stored (Python checks them: FrontierCore.counts),
-- ready as stored (polite) or counted, then the sizes of the delayed and dead sets.
local st = redis.call('HMGET', KEYS[1], 'accepted', 'filtered', 'done', 'retried',
                      'reclaimed', 'requeued', 'inflight', 'ready')
local out = {}
for i = 1, 7 do out[i] = st[i] or '0' end
if ARGV[1] == 'polite' then
  out[8] = st[8] or '0'
else
  local n = 0
  for i = 4, #KEYS do
    if ARGV[1] == 'zset' then
      n = n + redis.call('ZCARD', KEYS[i])
    else
      n = n + redis.call('LLEN', KEYS[i])
    end
  end
  out[8] = n
end
out[9] = redis.call('ZCARD', KEYS[2])
out[10] = redis.call('ZCARD', KEYS[3])
return out
