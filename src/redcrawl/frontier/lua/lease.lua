-- lease.lua: hand up to n READY requests to a worker (READY -> IN-FLIGHT) as one lease,
-- after promoting due DELAYED requests and reclaiming expired leases, all in one step.
-- KEYS, ARGV[1..3]: see lib.lua.
-- ARGV[4] worker id   ARGV[5] n   ARGV[6] lease ttl (ms)   ARGV[7] max_attempts
-- ARGV[8] weighted-fair schedule: one tier digit per slot (hex), e.g. "0102010201" for 5:3:2
-- ARGV[9] most leases to reclaim / delayed requests to promote in this call
-- Returns a flat list: token, then id, attempts, record for each request (empty when
-- paused or nothing is ready).
local worker, n, ttl = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local max_attempts, schedule, limit = tonumber(ARGV[7]), ARGV[8], tonumber(ARGV[9])

promote_due(limit)
reclaim_expired(limit, max_attempts)

local deadline = NOW + ttl
local hb = tonumber(redis.call('HGET', K_WORKERS, worker) or '0')
if deadline > hb then redis.call('HSET', K_WORKERS, worker, deadline) end

if redis.call('HGET', K_CONTROL, 'paused') == '1' then return {} end

local ids = {}
if ORDERING == 'priority' then
  local popped = redis.call('ZPOPMIN', ready_key(0), n)
  for i = 1, #popped, 2 do ids[#ids + 1] = popped[i] end
else
  -- Plan the picks over the schedule, skipping empty tiers, then pop per tier.
  local avail, take = {}, {}
  local total = 0
  for t = 0, NTIERS - 1 do
    avail[t] = redis.call('LLEN', ready_key(t))
    take[t] = 0
    total = total + avail[t]
  end
  if n > total then n = total end
  local cursor = tonumber(redis.call('HGET', K_CONTROL, 'cursor') or '0')
  local slots = #schedule
  local picked = 0
  while picked < n do
    local t = tonumber(string.sub(schedule, cursor % slots + 1, cursor % slots + 1), 16)
    cursor = cursor + 1
    if avail[t] > take[t] then
      take[t] = take[t] + 1
      picked = picked + 1
    end
  end
  if n > 0 then redis.call('HSET', K_CONTROL, 'cursor', cursor % (slots * 1000000)) end
  for t = 0, NTIERS - 1 do
    if take[t] > 0 then
      local got
      if ORDERING == 'fifo' then
        got = redis.call('RPOP', ready_key(t), take[t])
      else
        got = redis.call('LPOP', ready_key(t), take[t])
      end
      for _, id in ipairs(got) do ids[#ids + 1] = id end
    end
  end
end

if #ids == 0 then return {} end
local token = tostring(redis.call('HINCRBY', K_STATS, 'leases', 1))
local recs = hmget(K_REQ, ids)
local out, writes, kept, corrupt, whys = {token}, {}, {NOW, worker}, {}, {}
for i, id in ipairs(ids) do
  local rec = recs[i]
  local p, a, tk, env
  if rec then p, a, tk, env = parse(rec) end
  if rec and p == nil then
    corrupt[#corrupt + 1] = id; whys[#whys + 1] = CORRUPT
  elseif rec then
    a = a + 1
    rec = header(p, a, token, env)
    writes[#writes + 1] = id; writes[#writes + 1] = rec
    kept[#kept + 1] = id
    out[#out + 1] = id; out[#out + 1] = a; out[#out + 1] = rec
  end
end
kill(corrupt, whys)
local held = #kept - 2
if held == 0 then return {} end
bulk('HSET', K_REQ, writes)
redis.call('ZADD', K_INFLIGHT, deadline, token)
redis.call('HSET', K_LEASES, token, cmsgpack.pack(kept))
redis.call('HSET', K_LEFT, token, held)
redis.call('HINCRBY', K_STATS, 'inflight', held)
return out
