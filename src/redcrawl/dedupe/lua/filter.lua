-- filter.lua: a dedupe filter on its own (redcrawl.dedupe.Filter), after one of the
-- dedupe preludes. Header (before the prelude) sets K_FPD, DD, NOW, CHUNK and bulk().
-- KEYS[1] the filter's key base.
-- ARGV[1] spec   ARGV[2] now (ms, "" for the server clock)   ARGV[3] "check" | "add"
-- ARGV[4..] fingerprints (20 bytes each).
-- check: one character per fingerprint, "1" if present.
-- add: one character per fingerprint, "1" if it was new (and is now added).
local fps = {}
for i = 4, #ARGV do fps[#fps + 1] = ARGV[i] end
local present = dd_done_flags(fps)
local flags = {}
if ARGV[3] == 'check' then
  for i = 1, #fps do flags[i] = present[i] and '1' or '0' end
  return table.concat(flags)
end
local new, seen = {}, {}
for i, fp in ipairs(fps) do
  if present[i] or seen[fp] then
    flags[i] = '0'
  else
    seen[fp] = true
    new[#new + 1] = fp
    flags[i] = '1'
  end
end
dd_mark_done(new)
return table.concat(flags)
