-- lock_renew.lua: extend the lock's expiry only if it is still held by this owner.
-- KEYS[1] lock key (STRING: owner token)   ARGV[1] token   ARGV[2] new ttl (ms)
-- Returns 1 if renewed, 0 if the lock was not ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
