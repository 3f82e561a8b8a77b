-- rbloom.lua: DONE fingerprints in the server's RedisBloom module (a dedupe prelude).
--
-- Fingerprints are spread over DD_SHARDS scalable Bloom filters (bytes 1-3 pick one), so
-- each key stays of bounded size; each is created by BF.INSERT with the crawl's capacity
-- share, error rate and EXPANSION 2 (RedisBloom adds tighter layers as it fills).
--
-- Expects K_FPD (key base), DD (spec), NOW (ms), CHUNK and bulk() from the script before it.
-- DD = "rbloom <shards> <capacity per shard> <p> <generation ms> <generations>".

-- (one match, not a gmatch loop: this runs on every script call)
local DD_SHARDS, DD_CAP, DD_P, DD_GEN_MS, DD_GENS =
  string.match(DD, '^%S+ (%S+) (%S+) (%S+) (%S+) (%S+)')
DD_SHARDS, DD_GEN_MS, DD_GENS = tonumber(DD_SHARDS), tonumber(DD_GEN_MS), tonumber(DD_GENS)
local DD_GEN = (DD_GEN_MS > 0) and math.floor(NOW / DD_GEN_MS) or 0

local function dd_key(g, shard)
  if DD_GEN_MS > 0 then return K_FPD .. ':' .. g .. ':' .. shard end
  return K_FPD .. ':' .. shard
end

-- Shard of a fingerprint (bytes 1-3), and the item stored: the fingerprint itself.
local function dd_shard(fp)
  local b1, b2, b3 = string.byte(fp, 1, 3)
  return (b1 * 65536 + b2 * 256 + b3) % DD_SHARDS, fp
end

-- For a list of fingerprints, a list of booleans: is it (probably) DONE?
local function dd_done_flags(fps)
  local out = {}
  for i = 1, #fps do out[i] = false end
  local first = (DD_GEN_MS > 0) and (DD_GEN - DD_GENS) or 0
  for shard, g in pairs(dd_group(fps, dd_shard)) do
    for gen = DD_GEN, first, -1 do
      local key = dd_key(gen, shard)
      if redis.call('EXISTS', key) == 1 then
        dd_mark_hits(out, 'BF.MEXISTS', key, g[1], g[2])
      end
    end
  end
  return out
end

-- Record fingerprints as DONE (in the current generation).
local function dd_mark_done(fps)
  if #fps == 0 then return end
  for shard, g in pairs(dd_group(fps, dd_shard)) do
    local key, items = dd_key(DD_GEN, shard), g[1]
    for i = 1, #items, CHUNK do
      redis.call('BF.INSERT', key, 'CAPACITY', DD_CAP, 'ERROR', DD_P, 'EXPANSION', 2,
                 'ITEMS', unpack(items, i, math.min(i + CHUNK - 1, #items)))
    end
    if DD_GEN_MS > 0 then
      redis.call('PEXPIREAT', key, (DD_GEN + DD_GENS + 1) * DD_GEN_MS)
    end
  end
end
