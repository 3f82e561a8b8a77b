-- repair.lua: nothing but the prelude, which checks and repairs the crawl's counters and
-- layout (see lib.lua): for readers that found a corrupt counter (FrontierCore.counts).
-- KEYS, ARGV[1..4]: see lib.lua.
-- Returns what was repaired, one line each (empty: nothing was).
return REPAIRED
