-- common.lua: helpers shared by the dedupe preludes (prepended before each of them).

-- Group fingerprints by bucket: {bucket -> {items, positions}}, with
-- split(fp) -> bucket, item (what is stored for fp in that bucket).
local function dd_group(fps, split)
  local groups = {}
  for i, fp in ipairs(fps) do
    local bucket, item = split(fp)
    local g = groups[bucket]
    if not g then g = {{}, {}}; groups[bucket] = g end
    g[1][#g[1] + 1] = item
    g[2][#g[2] + 1] = i
  end
  return groups
end

-- One multi-item membership command (SMISMEMBER, BF.MEXISTS) over items in chunks; sets
-- out[at[j]] = true for every item found.
local function dd_mark_hits(out, cmd, key, items, at)
  for i = 1, #items, CHUNK do
    local last = math.min(i + CHUNK - 1, #items)
    local hits = redis.call(cmd, key, unpack(items, i, last))
    for j, v in ipairs(hits) do
      if v == 1 then out[at[i + j - 1]] = true end
    end
  end
end

-- A fingerprint as a client acks it: 20 bytes, or (exact mode: DedupeSpec.hint) the
-- 20 bytes followed by one byte (the member's length), the member as decimal text and the
-- level-0 bucket (its key, or its number in a spec with generations: dd_done_flags in
-- exact.lua), so that the script neither computes nor formats them (Lua
-- formats a number with sprintf, ~0.7 us each). Returns the fingerprint, then the member
-- and the bucket text if given (nil otherwise). Ids that are not fingerprints ("#<seq>")
-- are never longer than 20 bytes. (A push sends them as ARGV of their own: op_push.)
-- (string.sub and string.byte as upvalues: two table lookups less per call)
local dd_unhint
do
  local sub, byte = string.sub, string.byte
  dd_unhint = function(f)
    if #f <= 20 then return f end
    local ml = byte(f, 21)
    return sub(f, 1, 20), sub(f, 22, 21 + ml), sub(f, 22 + ml)
  end
end
