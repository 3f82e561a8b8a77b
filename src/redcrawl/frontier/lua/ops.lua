-- ops.lua: the frontier's batch operations as functions (prepended after lib.lua and the
-- dedupe prelude), so that a worker can store, acknowledge and lease in one script call
-- (settle.lua) and each operation also has a script of its own.

-- Dedupe and enqueue the requests given as ARGV triples (record "<priority>|0||<envelope>",
-- fingerprint or "" for no dedupe, priority) starting at ARGV[first], n of them.
-- A request is a duplicate if its fingerprint is DONE or already stored (READY, DELAYED,
-- IN-FLIGHT or DEAD), earlier in this batch included.
-- delay_ms > 0: accepted requests wait in DELAYED that long instead of going READY.
-- recrawl: DONE fingerprints do not count as duplicates (stored ones still do).
-- Returns one character per request: "1" accepted, "0" duplicate.
local function op_push(first, n, delay_ms, recrawl)
  if n == 0 then return '' end
  local fps = {}
  for i = 0, n - 1 do
    local fp = ARGV[first + 3 * i + 1]
    if fp ~= '' then fps[#fps + 1] = fp end
  end
  local done = {}
  if not recrawl then done = dd_done_flags(fps) end
  local seq = redis.call('HINCRBY', K_STATS, 'seq', n) - n
  local flags, items, plain = {}, {}, {}
  local j = 0
  for i = 1, n do
    local at = first + 3 * (i - 1)
    local rec, fp, priority = ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2])
    local id
    if fp ~= '' then
      j = j + 1
      if not done[j] and redis.call('HSETNX', K_REQ, fp, rec) == 1 then id = fp end
    else
      id = '#' .. (seq + i)
      plain[#plain + 1] = id; plain[#plain + 1] = rec
    end
    if id then
      items[#items + 1] = {id, priority, seq + i}
      flags[i] = '1'
    else
      flags[i] = '0'
    end
  end
  if #plain > 0 then bulk('HSET', K_REQ, plain) end
  if delay_ms > 0 then
    local z = {}
    for _, it in ipairs(items) do z[#z + 1] = NOW + delay_ms; z[#z + 1] = it[1] end
    if #z > 0 then bulk('ZADD', K_DELAYED, z) end
  else
    ready_push(items, false)
  end
  if #items > 0 then redis.call('HINCRBY', K_STATS, 'accepted', #items) end
  if #items < n then redis.call('HINCRBY', K_STATS, 'filtered', n - #items) end
  return table.concat(flags)
end

-- IN-FLIGHT -> DONE for the ARGV pairs (id, token) starting at ARGV[first], n of them.
-- A request no longer held under that token (its lease expired and it was handed out
-- again, or it was already acked) is left alone.
-- Returns one character per pair: "1" acked, "0" stale.
local function op_ack(first, n)
  if n == 0 then return '' end
  local ids, tokens = {}, {}
  for i = 0, n - 1 do
    ids[#ids + 1] = ARGV[first + 2 * i]
    tokens[#tokens + 1] = ARGV[first + 2 * i + 1]
  end
  local recs = hmget(K_REQ, ids)
  local ok, fps, per_lease, flags, seen = {}, {}, {}, {}, {}
  for i, id in ipairs(ids) do
    flags[i] = '0'
    local rec = recs[i]
    if rec and not seen[id] then
      local p, _, t = parse(rec)
      if p ~= nil and t ~= '' and t == tokens[i] then
        seen[id] = true
        flags[i] = '1'
        ok[#ok + 1] = id
        if is_fingerprint(id) then fps[#fps + 1] = id end
        per_lease[t] = (per_lease[t] or 0) + 1
      end
    end
  end
  if #ok > 0 then
    bulk('HDEL', K_REQ, ok)
    if redis.call('EXISTS', K_ERR) == 1 then bulk('HDEL', K_ERR, ok) end
    dd_mark_done(fps)
    for t, k in pairs(per_lease) do lease_release(t, k) end
    redis.call('HINCRBY', K_STATS, 'done', #ok)
  end
  return table.concat(flags)
end

-- Hand up to n READY requests to a worker (READY -> IN-FLIGHT) as one lease, after
-- promoting due DELAYED requests and reclaiming expired leases.
-- schedule: weighted-fair schedule, one tier digit per slot (hex), e.g. "0102010201".
-- limit: most leases to reclaim / delayed requests to promote in this call.
-- Returns a flat list: token, then id, attempts, record for each request (empty when
-- paused or nothing is ready).
local function op_lease(worker, n, ttl, max_attempts, schedule, limit)
  promote_due(limit)
  reclaim_expired(limit, max_attempts)

  local deadline = NOW + ttl
  local hb = tonumber(redis.call('HGET', K_WORKERS, worker) or '0')
  if deadline > hb then redis.call('HSET', K_WORKERS, worker, deadline) end

  if n <= 0 or redis.call('HGET', K_CONTROL, 'paused') == '1' then return {} end

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
end
