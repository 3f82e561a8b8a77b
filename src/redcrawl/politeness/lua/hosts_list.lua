-- hosts_list.lua: the politeness keys of a crawl with ready work or requests in flight,
-- found in bounded steps (prepended: lua/base.lua). Read-only. Their numbers are read by
-- the caller, pipelined (one short command each, not one long script). A step reads at
-- most ARGV[3] leased requests' records and says where the next step goes on, so that no
-- step holds Redis for long however many requests are in flight (the caller loops up to
-- its own total: hosts_records.LIST_LEASED_IDS).
--
-- KEYS[1]    inflight  ZSET lease token -> deadline (ms)
-- KEYS[2]    leases    HASH lease token -> msgpack [since, worker, id, ...]
-- KEYS[3]    req       HASH id -> record <priority>|<attempts>|<token>|K<len>:<key><env>
-- KEYS[4..]  open:<t>, one per tier: ZSET politeness key -> when it may next be granted
-- KEYS[4 + tiers..]  (streams crawls) the streams: their pending entries are the leased
--            requests (KEYS 1-2 are unused then)
-- ARGV[1] most keys read from the head of each tier's open zset (the keys that open
--         first); 0: the open zsets are not read (a step after the first)
-- ARGV[2] most leases read in all (soonest deadline first)
-- ARGV[3] most leased request records read by this step
-- ARGV[4] the number of tiers ("" or absent: every KEY after the third is an open zset)
-- ARGV[5] where to go on (the previous step's cursor; "" or absent: from the start):
--         "<lease index>:<request index in that lease>" (lists) or
--         "s<stream index>:<last entry id read>" (streams)
--
-- Returns {cut (1: a bound on the open zsets or the leases left keys out), the cursor
-- where a next step goes on ("" when every leased request was read), then the keys
-- found, each once}.
local ntiers = #KEYS - 3
if ARGV[4] and ARGV[4] ~= '' then ntiers = tonumber(ARGV[4]) end
local per_tier, max_leases, max_ids = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local cursor = ARGV[5] or ''
local cut = 0
local seen, order = {}, {}

local function add(key)
  if not seen[key] then seen[key] = true; order[#order + 1] = key end
end

if per_tier > 0 then
  for t = 0, ntiers - 1 do
    local zset = KEYS[4 + t]
    for _, key in ipairs(redis.call('ZRANGE', zset, 0, per_tier - 1)) do add(key) end
    if redis.call('ZCARD', zset) > per_tier then cut = 1 end
  end
end

local read = 0
local next_cursor = ''

-- keys with requests in flight: from the leases (bounded by the fleet's concurrency)
if string.sub(cursor, 1, 1) ~= 's' and redis.call('ZCARD', KEYS[1]) > 0 then
  local li, ri = string.match(cursor, '^(%d+):(%d+)$')
  li, ri = tonumber(li) or 0, tonumber(ri) or 0
  if li < max_leases then
    local tokens = redis.call('ZRANGE', KEYS[1], li, max_leases - 1)
    if redis.call('ZCARD', KEYS[1]) > max_leases then cut = 1 end
    for n, token in ipairs(tokens) do
      local rawlease = redis.call('HGET', KEYS[2], token)
      local ok, lease = pcall(function() return {cmsgpack.unpack(rawlease or '')} end)
      if ok and type(lease[1]) == 'table' then lease = lease[1] end
      if ok and type(lease) == 'table' then
        local ids = {}
        local first = (n == 1) and ri or 0
        local last = #lease - 2
        for i = first + 1, last do
          if read + #ids >= max_ids then
            next_cursor = (li + n - 1) .. ':' .. (i - 1)
            break
          end
          if type(lease[i + 2]) == 'string' then ids[#ids + 1] = lease[i + 2] end
        end
        read = read + #ids
        for i = 1, #ids, 1000 do
          local chunk = {unpack(ids, i, math.min(i + 999, #ids))}
          for _, rec in ipairs(redis.call('HMGET', KEYS[3], unpack(chunk))) do
            if rec then
              local a = string.find(rec, '|', 1, true)
              local b = a and string.find(rec, '|', a + 1, true)
              local c = b and string.find(rec, '|', b + 1, true)
              -- (held under the lease: its token, or, where the records keep no lease
              -- state, records.LEASE_STATE_OUT, a fence below it; in a crawl whose records
              -- keep it, a listed record with an empty or lower token field left the
              -- lease: its key is a candidate too, dropped by the caller when its state
              -- has nothing in flight)
              local t = c and string.sub(rec, b + 1, c - 1)
              if t and (t == token or t == '' or #t < #token or (#t == #token and t < token)) then
                local m, at = string.match(rec, '^K(%d+):()', c + 1)
                if m then add(string.sub(rec, at, at + tonumber(m) - 1)) end
              end
            end
          end
        end
        if next_cursor ~= '' then break end
      end
    end
  end
end

-- streams crawls: keys with requests in flight from the streams' pending entries (a
-- request's token ends with its entry id)
if next_cursor == '' then
  local si, after = string.match(cursor, '^s(%d+):(.*)$')
  si = tonumber(si) or 1
  if not after or after == '' then after = '-' end
  for i = 3 + ntiers + si, #KEYS do
    local want = max_ids - read
    if want <= 0 then
      next_cursor = 's' .. (i - 3 - ntiers) .. ':' .. after
      break
    end
    local start = after == '-' and '-' or ('(' .. after)
    local p = redis.pcall('XPENDING', KEYS[i], 'g', start, '+', want + 1)
    after = '-'
    if type(p) == 'table' and not p.err then
      local more = #p > want
      if more then p[#p] = nil end
      for _, e in ipairs(p) do
        read = read + 1
        local r = redis.call('XRANGE', KEYS[i], e[1], e[1])
        local id = r[1] and r[1][2] and r[1][2][2]
        local rec = id and redis.call('HGET', KEYS[3], id)
        if rec then
          local n, at = string.match(rec, '^%-?%d+|%d+|[^|]*/' ..
            string.gsub(e[1], '%-', '%%-') .. '|K(%d+):()')
          if n then add(string.sub(rec, at, at + tonumber(n) - 1)) end
        end
      end
      if more then
        next_cursor = 's' .. (i - 3 - ntiers) .. ':' .. p[#p][1]
        break
      end
    end
  end
end

local out = {cut, next_cursor}
for _, key in ipairs(order) do out[#out + 1] = key end
return out
