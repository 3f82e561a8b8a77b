-- exact.lua: the compact exact filter of DONE fingerprints (a dedupe prelude).
--
-- A 20-byte fingerprint becomes a bucket (the low DD_BITS bits of bytes 1-3) and a 63-bit
-- integer (bytes 9-16, top bit cleared), stored in the bucket's set. Small sets of
-- integers stay in Redis's intset encoding: 8 bytes per member plus the key, so about
-- 9 bytes per URL, against ~88 for a set of hex strings. Effective width: 63 + DD_BITS
-- bits. Every bucket must stay within the server's set-max-intset-entries (checked by
-- redcrawl.dedupe.Filter.health), or it silently becomes a hash table (memory x7).
--
-- Expects K_FPD (key base), DD (spec), NOW (ms), CHUNK and bulk() from the script before it.
-- DD = "exact <bucket bits> <generation ms> <generations>"; generation ms 0: no expiry,
-- else DONE fingerprints are added to the current time generation's keys, which expire
-- <generations> generations after it ends, and a lookup reads every live generation.

local DD_BITS, DD_GEN_MS, DD_GENS
do
  local f = {}
  for w in string.gmatch(DD, '%S+') do f[#f + 1] = w end
  DD_BITS, DD_GEN_MS, DD_GENS = tonumber(f[2]), tonumber(f[3]), tonumber(f[4])
end
local DD_BUCKETS = 2 ^ DD_BITS
local DD_GEN = (DD_GEN_MS > 0) and math.floor(NOW / DD_GEN_MS) or 0

-- Key of a bucket in generation g.
local function dd_key(g, bucket)
  if DD_GEN_MS > 0 then return K_FPD .. ':' .. g .. ':' .. bucket end
  return K_FPD .. ':' .. bucket
end

-- Bucket number and member (canonical decimal of a 63-bit integer) of a fingerprint.
-- Lua numbers are doubles, so the integer is built in base-10^7 limbs, 16 bits at a time
-- (every intermediate stays below 2^53).
local E7 = 10000000
local function dd_split(fp)
  local b1, b2, b3 = string.byte(fp, 1, 3)
  local c1, c2, c3, c4, c5, c6, c7, c8 = string.byte(fp, 9, 16)
  -- after the first 16 bits: one limb
  local l0 = (c1 % 128) * 256 + c2
  -- next 16: l0 * 65536 + chunk may exceed 10^7: split
  local v = l0 * 65536 + c3 * 256 + c4
  l0 = v % E7
  local l1 = (v - l0) / E7
  v = l0 * 65536 + c5 * 256 + c6
  l0 = v % E7
  v = l1 * 65536 + (v - l0) / E7
  l1 = v % E7
  local l2 = (v - l1) / E7
  v = l0 * 65536 + c7 * 256 + c8
  l0 = v % E7
  v = l1 * 65536 + (v - l0) / E7
  l1 = v % E7
  l2 = l2 * 65536 + (v - l1) / E7
  local member
  if l2 > 0 then member = string.format('%d%07d%07d', l2, l1, l0)
  elseif l1 > 0 then member = string.format('%d%07d', l1, l0)
  else member = string.format('%d', l0) end
  return (b1 * 65536 + b2 * 256 + b3) % DD_BUCKETS, member
end

-- Few fingerprints per bucket (the usual case: a batch is much smaller than the bucket
-- count): one call per fingerprint, without building groups.
local function dd_sparse(n) return n * 4 < DD_BUCKETS end

-- For a list of fingerprints, a list of booleans: is it DONE?
local function dd_done_flags(fps)
  local out = {}
  local first = (DD_GEN_MS > 0) and (DD_GEN - DD_GENS) or 0
  if dd_sparse(#fps) then
    for i, fp in ipairs(fps) do
      local bucket, member = dd_split(fp)
      local hit = false
      for gen = DD_GEN, first, -1 do
        if redis.call('SISMEMBER', dd_key(gen, bucket), member) == 1 then hit = true; break end
      end
      out[i] = hit
    end
    return out
  end
  for i = 1, #fps do out[i] = false end
  for bucket, g in pairs(dd_group(fps, dd_split)) do
    for gen = DD_GEN, first, -1 do
      dd_mark_hits(out, 'SMISMEMBER', dd_key(gen, bucket), g[1], g[2])
    end
  end
  return out
end

-- Record fingerprints as DONE (in the current generation).
local function dd_mark_done(fps)
  if #fps == 0 then return end
  if DD_GEN_MS == 0 and dd_sparse(#fps) then
    for _, fp in ipairs(fps) do
      local bucket, member = dd_split(fp)
      redis.call('SADD', dd_key(DD_GEN, bucket), member)
    end
    return
  end
  for bucket, g in pairs(dd_group(fps, dd_split)) do
    local key = dd_key(DD_GEN, bucket)
    bulk('SADD', key, g[1])
    if DD_GEN_MS > 0 then
      redis.call('PEXPIREAT', key, (DD_GEN + DD_GENS + 1) * DD_GEN_MS)
    end
  end
end
