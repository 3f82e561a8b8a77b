-- lock_release.lua: delete the lock only if it is still held by this owner.
-- KEYS[1] lock key (STRING: owner token)   ARGV[1] token
-- Returns 1 if released, 0 if the lock was not ours (expired or taken by another owner).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
