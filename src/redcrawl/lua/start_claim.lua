-- start_claim.lua: a RedisSpider's batch of start entries, taken off the start key and kept
-- under the worker's claim (one atomic step) until the requests made from them are stored
-- in the frontier (start_settle.lua clears the claim; start_recover.lua gives a stopped
-- worker's claims back). Prepended: lua/base.lua.
--
-- KEYS[1] the start key  LIST (taken from the head, as LPOP), SET (SPOP) or ZSET (ZPOPMAX)
-- KEYS[2] its claims     HASH "<worker>#<seq>" -> msgpack array of the entries of one batch
--                        (a ZSET's as member, score, member, score, ...); same slot as KEYS[1]
-- ARGV[1] the start key's type: list, set or zset
-- ARGV[2] how many entries at most (> 0)
-- ARGV[3] the claim's field, "<worker>#<seq>" (new for every batch)
--
-- Returns the entries taken, in the order read (a ZSET's as member, score, ...); {} when the
-- key is empty (then nothing is claimed). A key of another type fails with WRONGTYPE.
-- A call whose field is claimed already is a retry (its reply was lost and the client sent
-- it again): it returns that claim's entries and takes nothing, or the first batch would be
-- overwritten, off the key and in no claim.
local prior = redis.call('HGET', KEYS[2], ARGV[3])
if prior then
  return cmsgpack.unpack(prior)
end
local n = tonumber(ARGV[2])
local taken
if ARGV[1] == 'zset' then
  taken = redis.call('ZPOPMAX', KEYS[1], n)
elseif ARGV[1] == 'set' then
  taken = redis.call('SPOP', KEYS[1], n)
else
  taken = redis.call('LPOP', KEYS[1], n)
end
if not taken or #taken == 0 then
  return {}
end
redis.call('HSET', KEYS[2], ARGV[3], cmsgpack.pack(taken))
return taken
