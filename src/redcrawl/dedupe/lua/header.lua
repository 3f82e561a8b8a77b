-- header.lua: what a dedupe prelude expects, for scripts that run without the frontier's
-- lib.lua (filter.lua), after redcrawl/lua/base.lua (CHUNK, server_ms, bulk).
-- KEYS[1] the filter's key base; ARGV[1] spec; ARGV[2] now (ms, "" for the server clock).
local K_FPD, DD = KEYS[1], ARGV[1]
local NOW
if ARGV[2] ~= '' then NOW = tonumber(ARGV[2]) else NOW = server_ms() end
