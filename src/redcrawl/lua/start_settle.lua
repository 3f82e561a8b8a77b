-- start_settle.lua: a RedisSpider's batch of start entries is done with: its requests are
-- stored in the frontier, so its claim goes (start_claim.lua), and the entries it refused
-- go to the refused list, in the same step. Prepended: lua/base.lua.
--
-- KEYS[1] the start key's claims  HASH "<worker>#<seq>" -> msgpack array of entries
-- KEYS[2] its refused entries     LIST of JSON records, newest first; same slot as KEYS[1]
-- ARGV[1] the claim's field ("" for none: entries popped without a claim)
-- ARGV[2] the most records KEYS[2] keeps (the oldest beyond it are trimmed)
-- ARGV[3..] refused records (JSON), oldest first
--
-- Returns the length of KEYS[2] (0 when no record was given).
if ARGV[1] ~= '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
end
if #ARGV < 3 then
  return 0
end
for i = 3, #ARGV do
  redis.call('LPUSH', KEYS[2], ARGV[i])
end
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[2]) - 1)
return redis.call('LLEN', KEYS[2])
