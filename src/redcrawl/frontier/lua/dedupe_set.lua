-- dedupe_set.lua: exact dedupe of DONE requests on a Redis set of binary fingerprints
-- (prepended to the frontier scripts after lib.lua). Queued requests need no structure of
-- their own: a queued request's fingerprint is its id in the req hash.

-- For a list of fingerprints, a list of booleans: is it DONE?
local function dd_done_flags(fps)
  local out = {}
  for i = 1, #fps, CHUNK do
    local part = redis.call('SMISMEMBER', K_FPD, unpack(fps, i, math.min(i + CHUNK - 1, #fps)))
    for _, v in ipairs(part) do out[#out + 1] = (v == 1) end
  end
  return out
end

-- Record fingerprints as DONE.
local function dd_mark_done(fps)
  if #fps > 0 then bulk('SADD', K_FPD, fps) end
end
