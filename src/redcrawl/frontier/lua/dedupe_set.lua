-- dedupe_set.lua: exact dedupe on two Redis sets of binary fingerprints (prepended to the
-- frontier scripts after lib.lua). K_FPQ holds fingerprints accepted and not yet done,
-- K_FPD those done. A request is a duplicate if its fingerprint is in either.

-- true if fp was new (and is now recorded as queued), false if it is a duplicate.
local function dd_add(fp)
  if redis.call('SISMEMBER', K_FPD, fp) == 1 then return false end
  return redis.call('SADD', K_FPQ, fp) == 1
end

-- queued -> done
local function dd_done(fp)
  redis.call('SREM', K_FPQ, fp)
  redis.call('SADD', K_FPD, fp)
end
