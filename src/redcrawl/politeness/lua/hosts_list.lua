-- hosts_list.lua: the politeness keys of a crawl with ready work or requests in flight,
-- found in one bounded step (prepended: lua/base.lua). Read-only. Their numbers are read
-- by the caller, pipelined (one short command each, not one long script).
--
-- KEYS[1]    inflight  ZSET lease token -> deadline (ms)
-- KEYS[2]    leases    HASH lease token -> msgpack [since, worker, id, ...]
-- KEYS[3]    req       HASH id -> record <priority>|<attempts>|<token>|K<len>:<key><env>
-- KEYS[4..]  open:<t>, one per tier: ZSET politeness key -> when it may next be granted
-- KEYS[4 + tiers..]  (streams crawls) the streams: their pending entries are the leased
--            requests (KEYS 1-2 are unused then)
-- ARGV[1] most keys read from the head of each tier's open zset (the keys that open
--         first)
-- ARGV[2] most leases read (soonest deadline first)
-- ARGV[3] most leased request ids read
-- ARGV[4] the number of tiers ("" or absent: every KEY after the third is an open zset)
--
-- Returns {complete (1: every key with ready work or in flight was found, 0: a bound
-- cut the reading short), then the keys found, each once}.
local ntiers = #KEYS - 3
if ARGV[4] and ARGV[4] ~= '' then ntiers = tonumber(ARGV[4]) end
local per_tier, max_leases, max_ids = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local complete = 1
local seen, order = {}, {}

local function add(key)
  if not seen[key] then seen[key] = true; order[#order + 1] = key end
end

for t = 0, ntiers - 1 do
  local zset = KEYS[4 + t]
  for _, key in ipairs(redis.call('ZRANGE', zset, 0, per_tier - 1)) do add(key) end
  if redis.call('ZCARD', zset) > per_tier then complete = 0 end
end

-- keys with requests in flight: from the leases (bounded by the fleet's concurrency)
local tokens = redis.call('ZRANGE', KEYS[1], 0, max_leases - 1)
if redis.call('ZCARD', KEYS[1]) > max_leases then complete = 0 end
local read = 0
for _, token in ipairs(tokens) do
  if read >= max_ids then complete = 0; break end
  local rawlease = redis.call('HGET', KEYS[2], token)
  local ok, lease = pcall(function() return {cmsgpack.unpack(rawlease or '')} end)
  if ok and type(lease[1]) == 'table' then lease = lease[1] end
  if ok and type(lease) == 'table' then
    local ids = {}
    for i = 3, #lease do
      if type(lease[i]) == 'string' and #ids + read < max_ids then ids[#ids + 1] = lease[i] end
    end
    if #lease - 2 + read > max_ids then complete = 0 end
    read = read + #ids
    for i = 1, #ids, 1000 do
      local chunk = {unpack(ids, i, math.min(i + 999, #ids))}
      for _, rec in ipairs(redis.call('HMGET', KEYS[3], unpack(chunk))) do
        if rec then
          local a = string.find(rec, '|', 1, true)
          local b = a and string.find(rec, '|', a + 1, true)
          local c = b and string.find(rec, '|', b + 1, true)
          -- (held under the lease: its token, or, where the records keep no lease state,
          -- records.LEASE_STATE_OUT, a fence below it; in a crawl whose records keep it, a
          -- listed record with an empty or lower token field left the lease: its key is a
          -- candidate too, dropped by the caller when its state has nothing in flight)
          local t = c and string.sub(rec, b + 1, c - 1)
          if t and (t == token or t == '' or #t < #token or (#t == #token and t < token)) then
            local n, at = string.match(rec, '^K(%d+):()', c + 1)
            if n then add(string.sub(rec, at, at + tonumber(n) - 1)) end
          end
        end
      end
    end
  end
end

-- streams crawls: keys with requests in flight from the streams' pending entries (a
-- request's token ends with its entry id)
for i = 4 + ntiers, #KEYS do
  if read >= max_ids then complete = 0; break end
  local want = max_ids - read
  local p = redis.pcall('XPENDING', KEYS[i], 'g', '-', '+', want + 1)
  if type(p) == 'table' and not p.err then
    if #p > want then complete = 0; p[#p] = nil end
    for _, e in ipairs(p) do
      read = read + 1
      local r = redis.call('XRANGE', KEYS[i], e[1], e[1])
      local id = r[1] and r[1][2] and r[1][2][2]
      local rec = id and redis.call('HGET', KEYS[3], id)
      if rec then
        local n, at = string.match(rec, '^%-?%d+|%d+|[^|]*/' .. string.gsub(e[1], '%-', '%%-') ..
          '|K(%d+):()')
        if n then add(string.sub(rec, at, at + tonumber(n) - 1)) end
      end
    end
  end
end

local out = {complete}
for _, key in ipairs(order) do out[#out + 1] = key end
return out
