-- bloom.lua: a scalable Bloom filter of DONE fingerprints on plain bitmaps (a dedupe
-- prelude), for servers without the RedisBloom module.
--
-- Layer i holds up to n0 * 2^i fingerprints at a false-positive rate of p / 2^i (so all
-- layers together stay below 2p); a new layer starts when the one before is full. A
-- layer of m bits with k hash functions uses the bit positions (h1 + j*h2) mod m,
-- j = 0..k-1, with h1 and h2 two 48-bit numbers taken from the fingerprint (bytes 9-14
-- and 15-20). Bitmaps are split into keys of 2^<segment bits> - 512 bits each, so no key
-- grows beyond 2^<segment bits> / 8 bytes however large the crawl (64 bytes short of the
-- power of two, so that a key with its header fits jemalloc's size class, not the next one
-- up, 25% larger).
--
-- Expects K_FPD (key base), DD (spec), NOW (ms), CHUNK and bulk() from the script before it.
-- DD = "bloom <n0> <p> <generation ms> <generations> <segment bits>"; generations as in
-- exact.lua (the count of fingerprints added to each generation is in <base>[:<g>]:n).

-- DD_GEN_MS, dd_done_flags and dd_mark_done are what the scripts after it use; the rest is
-- built by one call of dd_bloom(), for the reason given at the top of queue_lists.lua.
local DD_GEN_MS, dd_done_flags, dd_mark_done
local function dd_bloom()
  local DD_N0, DD_P, DD_GENS, DD_SEG
  DD_N0, DD_P, DD_GEN_MS, DD_GENS, DD_SEG = string.match(DD, '^%S+ (%S+) (%S+) (%S+) (%S+) (%S+)')
  DD_N0, DD_P, DD_GEN_MS = tonumber(DD_N0), tonumber(DD_P), tonumber(DD_GEN_MS)
  DD_GENS, DD_SEG = tonumber(DD_GENS), 2 ^ tonumber(DD_SEG) - 512
  local DD_GEN = (DD_GEN_MS > 0) and math.floor(NOW / DD_GEN_MS) or 0
  local LN2 = math.log(2)

  local function dd_base(g)
    if DD_GEN_MS > 0 then return K_FPD .. ':' .. g end
    return K_FPD
  end

  -- Bits and hash count of layer i.
  local dd_layers = {}
  local function dd_layer(i)
    local l = dd_layers[i]
    if not l then
      local n, p = DD_N0 * 2 ^ i, DD_P / 2 ^ i
      local m = math.ceil(-n * math.log(p) / (LN2 * LN2))
      l = {m, math.max(1, math.floor(m / n * LN2 + 0.5)), n}
      dd_layers[i] = l
    end
    return l
  end

  -- Index of the layer being filled once `count` fingerprints were added.
  local function dd_top(count)
    local i, total = 0, DD_N0
    while count >= total do
      i = i + 1
      total = total + DD_N0 * 2 ^ i
    end
    return i
  end

  local function dd_hashes(fp)
    local a1, a2, a3, a4, a5, a6 = string.byte(fp, 9, 14)
    local b1, b2, b3, b4, b5, b6 = string.byte(fp, 15, 20)
    local h1 = ((((a1 * 256 + a2) * 256 + a3) * 256 + a4) * 256 + a5) * 256 + a6
    local h2 = ((((b1 * 256 + b2) * 256 + b3) * 256 + b4) * 256 + b5) * 256 + b6
    return h1, h2
  end

  -- Is every bit of fp set in layer i of the generation at base?
  local function dd_in_layer(base, i, h1, h2)
    local l = dd_layer(i)
    local m = l[1]
    for j = 0, l[2] - 1 do
      local pos = (h1 + j * h2) % m
      local seg = math.floor(pos / DD_SEG)
      if redis.call('GETBIT', base .. ':' .. i .. ':' .. seg, pos - seg * DD_SEG) == 0 then
        return false
      end
    end
    return true
  end

  -- Create layer i's bitmaps at their final size (SETBIT alone would grow a string with
  -- room to spare, up to 2x), zero-filled, expiring with their generation.
  local function dd_make_layer(base, i, expire_at)
    local m = dd_layer(i)[1]
    local seg = 0
    while seg * DD_SEG < m do
      local bytes = math.ceil(math.min(DD_SEG, m - seg * DD_SEG) / 8)
      local key = base .. ':' .. i .. ':' .. seg
      if expire_at then
        redis.call('SET', key, string.rep('\0', bytes), 'NX', 'PXAT', expire_at)
      else
        redis.call('SET', key, string.rep('\0', bytes), 'NX')
      end
      seg = seg + 1
    end
  end

  -- Set fp's bits in layer i (one BITFIELD per bitmap key touched); returns true if any
  -- bit was new.
  local function dd_set_layer(base, i, h1, h2)
    local l = dd_layer(i)
    local m = l[1]
    local per_seg = {}
    for j = 0, l[2] - 1 do
      local pos = (h1 + j * h2) % m
      local seg = math.floor(pos / DD_SEG)
      local args = per_seg[seg]
      if not args then args = {}; per_seg[seg] = args end
      args[#args + 1] = 'SET'; args[#args + 1] = 'u1'
      args[#args + 1] = pos - seg * DD_SEG; args[#args + 1] = 1
    end
    local new = false
    for seg, args in pairs(per_seg) do
      local old = redis.call('BITFIELD', base .. ':' .. i .. ':' .. seg, unpack(args))
      for _, bit in ipairs(old) do
        if bit == 0 then new = true end
      end
    end
    return new
  end

  -- Fingerprints added to layers before layer i.
  local function dd_before(i)
    return DD_N0 * (2 ^ i - 1)
  end

  local dd_counts = {}
  local function dd_count(g)
    local c = dd_counts[g]
    if not c then
      c = tonumber(redis.call('GET', dd_base(g) .. ':n') or '0')
      dd_counts[g] = c
    end
    return c
  end

  local function dd_in_gen(g, h1, h2)
    local count = dd_count(g)
    if count == 0 then return false end
    local base = dd_base(g)
    for i = dd_top(count), 0, -1 do
      if dd_in_layer(base, i, h1, h2) then return true end
    end
    return false
  end

  -- For a list of fingerprints, a list of booleans: is it (probably) DONE?
  dd_done_flags = function(fps)
    local out = {}
    local first = (DD_GEN_MS > 0) and (DD_GEN - DD_GENS) or 0
    for i, fp in ipairs(fps) do
      local h1, h2 = dd_hashes(fp)
      local hit = false
      for g = DD_GEN, first, -1 do
        if dd_in_gen(g, h1, h2) then hit = true; break end
      end
      out[i] = hit
    end
    return out
  end

  -- Record fingerprints as DONE (in the current generation's top layer).
  dd_mark_done = function(fps)
    if #fps == 0 then return end
    local base = dd_base(DD_GEN)
    local expire_at = nil
    if DD_GEN_MS > 0 then expire_at = (DD_GEN + DD_GENS + 1) * DD_GEN_MS end
    local added = 0
    for _, fp in ipairs(fps) do
      local h1, h2 = dd_hashes(fp)
      if not dd_in_gen(DD_GEN, h1, h2) then
        local count = dd_count(DD_GEN)
        local top = dd_top(count)
        if count == dd_before(top) then dd_make_layer(base, top, expire_at) end
        if dd_set_layer(base, top, h1, h2) then
          dd_counts[DD_GEN] = count + 1
          added = added + 1
        end
      end
    end
    if added > 0 then
      redis.call('INCRBY', base .. ':n', added)
      if expire_at then redis.call('PEXPIREAT', base .. ':n', expire_at) end
    end
  end
end
dd_bloom()
