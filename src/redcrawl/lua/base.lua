-- base.lua: the first lines of every frontier and dedupe-filter script (prepended by
-- redcrawl.scripts for redcrawl/frontier/core.py and redcrawl/dedupe).

local CHUNK = 2000

-- The server's clock in milliseconds.
local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- redis.call(cmd, key, args...) in chunks (Lua's unpack has a stack limit).
local function bulk(cmd, key, args)
  for i = 1, #args, CHUNK do
    redis.call(cmd, key, unpack(args, i, math.min(i + CHUNK - 1, #args)))
  end
end
