-- header.lua: what a dedupe prelude expects, for scripts that run without the frontier's
-- lib.lua (filter.lua). KEYS[1] the filter's key base; ARGV[1] spec; ARGV[2] now (ms, ""
-- for the server clock).
local K_FPD, DD = KEYS[1], ARGV[1]
local NOW
if ARGV[2] ~= '' then
  NOW = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local CHUNK = 2000

local function bulk(cmd, key, args)
  for i = 1, #args, CHUNK do
    redis.call(cmd, key, unpack(args, i, math.min(i + CHUNK - 1, #args)))
  end
end
