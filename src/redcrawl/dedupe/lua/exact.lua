-- exact.lua: the compact exact filter of DONE fingerprints (a dedupe prelude).
--
-- A 20-byte fingerprint becomes a 24-bit hash h (bytes 1-3) and a 63-bit integer (bytes
-- 9-16, top bit cleared); the integer is stored in the set of bucket h mod <buckets>.
-- Small sets of integers stay in Redis's intset encoding: 8 bytes per member plus the
-- key, about 9 bytes per URL against ~88 for a set of hex strings. Effective width:
-- 63 + <bucket bits> bits.
--
-- Levels (specs with a fill, "exact b g gs fill"): a bucket must never outgrow Redis's
-- default set-max-intset-entries (512), or it silently becomes a hash table (memory x8,
-- never converted back), so no server setting is needed and a restart changes nothing.
-- Level i has 2^min(24, b + i) buckets and holds at most <fill> (320) fingerprints per
-- bucket: a counter, <base>:n, counts the fingerprints added, and once it reaches what
-- the levels so far hold, new fingerprints go into the next level (twice the buckets).
-- A lookup checks every level up to the one being filled (level 0 always, whatever the
-- counter says). Level 0's keys are <base>:<bucket>, level i's <base>:L<i>:<bucket>.
-- Legacy specs ("exact b g gs", crawls created before levels): one level, no counter,
-- buckets grow without bound (they need a raised set-max-intset-entries).
--
-- Expects K_FPD (key base), DD (spec), NOW (ms), CHUNK and bulk() from the script before it.
-- DD = "exact <bucket bits> <generation ms> <generations> [<fill>]"; generation ms 0: no
-- expiry, else DONE fingerprints are added to the current time generation's keys
-- (<base> is K_FPD:<generation>), which expire <generations> generations after it ends,
-- and a lookup reads every live generation.

-- DD_GEN_MS, dd_done_flags and dd_mark_done are what the scripts after it use; the rest is
-- built by one call of dd_exact(), for the reason given at the top of queue_lists.lua.
local DD_GEN_MS, dd_done_flags, dd_mark_done
local function dd_exact()
  -- (one match, not a gmatch loop: this runs on every script call)
  local DD_BITS, DD_GENS, DD_FILL
  DD_BITS, DD_GEN_MS, DD_GENS, DD_FILL = string.match(DD, '^%S+ (%d+) (%d+) (%d+) ?(%d*)')
  DD_BITS, DD_GEN_MS, DD_GENS = tonumber(DD_BITS), tonumber(DD_GEN_MS), tonumber(DD_GENS)
  DD_FILL = tonumber(DD_FILL) or 0
  local DD_BUCKETS = 2 ^ DD_BITS
  local DD_GEN = (DD_GEN_MS > 0) and math.floor(NOW / DD_GEN_MS) or 0

  -- Key base of generation g.
  local function dd_base(g)
    if DD_GEN_MS > 0 then return K_FPD .. ':' .. g end
    return K_FPD
  end

  -- Buckets of level i.
  local function dd_nb(level)
    if level == 0 then return DD_BUCKETS end
    return 2 ^ math.min(24, DD_BITS + level)
  end

  -- Key of a bucket of level `level` in the generation whose key base is `base`.
  local function dd_key(base, level, bucket)
    if level == 0 then return base .. ':' .. bucket end
    return base .. ':L' .. level .. ':' .. bucket
  end

  -- The level being filled once `count` fingerprints were added, and how many the levels
  -- up to it hold together.
  local function dd_level_of(count)
    local level, total = 0, DD_FILL * DD_BUCKETS
    while count >= total do
      level = level + 1
      total = total + DD_FILL * dd_nb(level)
    end
    return level, total
  end

  -- Fingerprints added to generation g (levels only; read once per script call).
  local dd_counts = {}
  local function dd_count(g)
    local c = dd_counts[g]
    if not c then
      c = tonumber(redis.call('GET', dd_base(g) .. ':n')) or 0
      dd_counts[g] = c
    end
    return c
  end

  -- The highest level of generation g that may hold fingerprints (cached per call).
  local dd_tops = {}
  local function dd_top(g)
    if DD_FILL == 0 then return 0 end
    local top = dd_tops[g]
    if not top then
      top = dd_level_of(dd_count(g))
      dd_tops[g] = top
    end
    return top
  end

  -- 24-bit hash and member (canonical decimal of a 63-bit integer) of a fingerprint.
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
    return b1 * 65536 + b2 * 256 + b3, member
  end

  -- The 24-bit hash alone (bytes 1-3).
  local function dd_h(fp)
    local b1, b2, b3 = string.byte(fp, 1, 3)
    return b1 * 65536 + b2 * 256 + b3
  end

  -- Hash and member of fps[i]: the member the client computed (hm[i], see dd_unhint in
  -- common.lua) or computed here.
  local function dd_hm(fps, i, hm)
    local m = hm and hm[i]
    if m then return dd_h(fps[i]), m end
    return dd_split(fps[i])
  end

  -- Key of the bucket of level `level` holding hash h (of fps[i]) in the generation with
  -- key base `base`: for level 0, from what the client gave (hb[i]) if anything: the key
  -- itself without generations, else the bucket's number.
  local function dd_bkey(base, level, h, hb, i)
    local b = level == 0 and hb and hb[i]
    if b then
      if DD_GEN_MS == 0 then return b end
      return base .. ':' .. b
    end
    return dd_key(base, level, h % dd_nb(level))
  end

  -- Few fingerprints per bucket (the usual case: a batch is much smaller than the bucket
  -- count): one call per fingerprint, without building groups.
  local function dd_sparse(n) return n * 4 < DD_BUCKETS end

  -- Group positions 1..#hs by bucket of `level`: {bucket -> {members, positions}}.
  local function dd_groups(hs, members, level)
    local nb, groups = dd_nb(level), {}
    for i = 1, #hs do
      local bucket = hs[i] % nb
      local g = groups[bucket]
      if not g then g = {{}, {}}; groups[bucket] = g end
      g[1][#g[1] + 1] = members[i]
      g[2][#g[2] + 1] = i
    end
    return groups
  end

  -- For a list of fingerprints, a list of booleans: is it DONE? hm, hb: nil, or the
  -- members and level-0 buckets the client computed, aligned with fps (nil where not); a
  -- bucket as its key (K_FPD:<bucket>) in a spec without generations (DD_GEN_MS 0: the
  -- script then builds no key name, ~1k instructions per fingerprint), else as its number
  -- (DedupeSpec.hints).
  -- at, off (op_push): no hm, hb lists; the hints of fps[i] are ARGV[at[i] + off] (the
  -- member) and the ARGV after it (the bucket), "" for none (two table writes less per
  -- pushed request).
  dd_done_flags = function(fps, hm, hb, at, off)
    local out = {}
    local first = (DD_GEN_MS > 0) and (DD_GEN - DD_GENS) or 0
    if at and DD_GEN_MS == 0 and dd_sparse(#fps) and dd_top(0) == 0 then
      -- the usual case, as below, reading the hints where the client put them
      local call, argv = redis.call, ARGV
      for i = 1, #fps do
        local a = at[i] + off
        local m = argv[a]
        if m ~= '' then
          out[i] = call('SISMEMBER', argv[a + 1], m) == 1
        else
          local h, member = dd_split(fps[i])
          out[i] = call('SISMEMBER', dd_key(K_FPD, 0, h % DD_BUCKETS), member) == 1
        end
      end
      return out
    end
    if at then
      hm, hb = {}, {}
      for i = 1, #fps do
        local a = at[i] + off
        local m = ARGV[a]
        if m ~= '' then hm[i] = m; hb[i] = ARGV[a + 1] end
      end
    end
    if hb and DD_GEN_MS == 0 and dd_sparse(#fps) and dd_top(0) == 0 then
      -- the usual case (one generation, one level, the client's hints): one SISMEMBER per
      -- fingerprint, on the key the client gave (this runs for every request pushed;
      -- redis.call through a local)
      local call = redis.call
      for i = 1, #fps do
        local b = hb[i]
        if b then
          out[i] = call('SISMEMBER', b, hm[i]) == 1
        else
          local h, member = dd_split(fps[i])
          out[i] = redis.call('SISMEMBER', dd_key(K_FPD, 0, h % DD_BUCKETS), member) == 1
        end
      end
      return out
    end
    if dd_sparse(#fps) then
      for i = 1, #fps do
        local h, member = dd_hm(fps, i, hm)
        local hit = false
        for gen = DD_GEN, first, -1 do
          local base = dd_base(gen)
          for level = dd_top(gen), 0, -1 do
            if redis.call('SISMEMBER', dd_bkey(base, level, h, hb, i), member) == 1 then
              hit = true; break
            end
          end
          if hit then break end
        end
        out[i] = hit
      end
      return out
    end
    local hs, members = {}, {}
    for i = 1, #fps do
      out[i] = false
      hs[i], members[i] = dd_hm(fps, i, hm)
    end
    for gen = DD_GEN, first, -1 do
      local base = dd_base(gen)
      for level = dd_top(gen), 0, -1 do
        for bucket, g in pairs(dd_groups(hs, members, level)) do
          dd_mark_hits(out, 'SMISMEMBER', dd_key(base, level, bucket), g[1], g[2])
        end
      end
    end
    return out
  end

  -- SADD members to key in chunks; returns how many were new.
  local function dd_sadd(key, members)
    local added = 0
    for i = 1, #members, CHUNK do
      added = added + redis.call('SADD', key, unpack(members, i, math.min(i + CHUNK - 1, #members)))
    end
    return added
  end

  -- Legacy specs: record fingerprints as DONE in the only level.
  local function dd_mark_done_legacy(fps, hm, hb)
    local base = dd_base(DD_GEN)
    if DD_GEN_MS == 0 and dd_sparse(#fps) then
      for i = 1, #fps do
        local h, member = dd_hm(fps, i, hm)
        redis.call('SADD', dd_bkey(base, 0, h, hb, i), member)
      end
      return
    end
    local hs, members = {}, {}
    for i = 1, #fps do hs[i], members[i] = dd_hm(fps, i, hm) end
    for bucket, g in pairs(dd_groups(hs, members, 0)) do
      local key = dd_key(base, 0, bucket)
      bulk('SADD', key, g[1])
      if DD_GEN_MS > 0 then
        redis.call('PEXPIREAT', key, (DD_GEN + DD_GENS + 1) * DD_GEN_MS)
      end
    end
  end

  -- Record fingerprints as DONE (in the current generation, in the level being filled).
  -- hm, hb: as for dd_done_flags.
  dd_mark_done = function(fps, hm, hb)
    if #fps == 0 then return end
    if DD_FILL == 0 then return dd_mark_done_legacy(fps, hm, hb) end
    local base = dd_base(DD_GEN)
    local expire_at = (DD_GEN_MS > 0) and (DD_GEN + DD_GENS + 1) * DD_GEN_MS or nil
    local count = dd_count(DD_GEN)
    local level, room = dd_level_of(count)
    local added = 0
    if count + #fps <= room and DD_GEN_MS == 0 and dd_sparse(#fps) then
      -- the usual case: a few fingerprints, all into the level being filled (in level 0
      -- with the client's hints, on the key it gave: this runs for every request acked)
      local direct = level == 0 and hb
      for i = 1, #fps do
        local b = direct and hb[i]
        if b then
          added = added + redis.call('SADD', b, hm[i])
        else
          local h, member = dd_hm(fps, i, hm)
          added = added + redis.call('SADD', dd_bkey(base, level, h, hb, i), member)
        end
      end
    elseif count + #fps <= room then
      local hs, members = {}, {}
      for i = 1, #fps do hs[i], members[i] = dd_hm(fps, i, hm) end
      for bucket, g in pairs(dd_groups(hs, members, level)) do
        local key = dd_key(base, level, bucket)
        added = added + dd_sadd(key, g[1])
        if expire_at then redis.call('PEXPIREAT', key, expire_at) end
      end
    else
      -- the batch may cross into the next level: one fingerprint at a time, the level
      -- following the count (so every fingerprint is in a level a lookup reads)
      for i = 1, #fps do
        if count + added >= room then level, room = dd_level_of(count + added) end
        local h, member = dd_hm(fps, i, hm)
        local key = dd_bkey(base, level, h, hb, i)
        if redis.call('SADD', key, member) == 1 then
          added = added + 1
          if expire_at then redis.call('PEXPIREAT', key, expire_at) end
        end
      end
    end
    if added > 0 then
      dd_counts[DD_GEN] = count + added
      dd_tops[DD_GEN] = nil
      -- SET, not INCRBY: the count was read in this call, and a corrupt counter must not
      -- fail the script after its SADDs (it restarts from level 0 instead)
      if expire_at then
        redis.call('SET', base .. ':n', count + added, 'PXAT', expire_at)
      else
        redis.call('SET', base .. ':n', count + added)
      end
    end
  end
end
dd_exact()
