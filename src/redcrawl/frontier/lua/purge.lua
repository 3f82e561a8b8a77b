-- purge.lua: delete a crawl's whole state, keeping only the counters that name things
-- (lease tokens, #seq ids), so that a worker still holding a lease from before the purge
-- can never act on a request leased after it. Standalone (no lib.lua prelude).
-- KEYS[1] stats hash; KEYS[2..] every other key of the crawl.
-- Returns the number of keys deleted. UNLINK, not DEL: Redis frees a large crawl's memory
-- in the background, so the call stays short (the API's socket timeout is a few seconds).
local leases = redis.call('HGET', KEYS[1], 'leases')
local seq = redis.call('HGET', KEYS[1], 'seq')
local n = redis.call('UNLINK', unpack(KEYS))
if leases then redis.call('HSET', KEYS[1], 'leases', leases) end
if seq then redis.call('HSET', KEYS[1], 'seq', seq) end
return n
