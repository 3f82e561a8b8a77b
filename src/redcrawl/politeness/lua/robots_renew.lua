-- robots_renew.lua: extend the caller's locks on the robots.txt it is still fetching
-- (prepended: lua/base.lua).
--
-- KEYS[1..n] robots:lock:<origin>  STRING the token of the worker fetching it
-- ARGV[1] the caller's token
-- ARGV[2] lock time to live (ms)
--
-- Returns how many of the locks were still the caller's (and were extended).
local renewed = 0
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2])
    renewed = renewed + 1
  end
end
return renewed
