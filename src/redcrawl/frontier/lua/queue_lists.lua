-- queue_lists.lua: the lists backend's queue layer (after lib.lua, the dedupe prelude and
-- polite.lua; it defines the hooks lib.lua's QUEUE LAYER block declares, and polite.lua's
-- lease_since; nothing outside this file uses anything else of it): ready queues are
-- Redis lists per tier (or one ZSET for strict priority), KEYS 13..; with politeness
-- (POLITE) the per-key queues of polite.lua instead; leases are entries of
-- inflight/leases/left (lib.lua's KEYS 2-4).

-- The layer is built by one call of queue_layer() below, not as closures of the main
-- chunk: Lua makes a main-chunk closure walk the list of open upvalues (every captured
-- local of the scripts before it) once per upvalue it captures, ~40k instructions a call
-- for this file; closures made in here copy their upvalues from queue_layer's instead.
local function queue_layer()
  PUSH_STRIDE = 3  -- record, fingerprint, priority

  local function ready_key(tier) return KEYS[FIRST_TIER + tier] end

  -- Put n ids into their ready queues: ids, prios aligned lists (prios nil: all of
  -- priority p; seqs: their push sequence numbers, read for strict priority only, where
  -- front takes seq 0). front=true:
  -- served next within the tier (requests coming back from IN-FLIGHT, DELAYED or DEAD).
  -- (numeric loops and the tier bounds inline, no table per tier unless it gets ids, and
  -- the ids pushed as they are when they share one priority: this runs for every request
  -- pushed)
  -- (ids holds exactly the n ids: the usual case pushes it whole)
  local function push_ids(n, ids, prios, seqs, front, p)
    if n == 0 then return end
    if ORDERING == 'priority' then
      -- strict priority; FIFO among equal priorities by push sequence (front: seq 0)
      local z = {}
      for i = 1, n do
        z[2 * i - 1] = -(prios and prios[i] or p) * TWO32 + (front and 0 or (seqs[i] % TWO32))
        z[2 * i] = ids[i]
      end
      bulk('ZADD', ready_key(0), z)
      return
    end
    local cmd = (ORDERING == 'fifo' and front) and 'RPUSH' or 'LPUSH'
    local nb = #BOUNDS
    local p1, one = p, true
    if prios then
      p1 = prios[1]
      for i = 2, n do
        if prios[i] ~= p1 then one = false; break end
      end
    end
    if one then
      local t = nb
      for k = 1, nb do
        if p1 >= BOUNDS[k] then t = k - 1; break end
      end
      bulk(cmd, ready_key(t), ids)
      return
    end
    local per_tier, sizes = {}, {}
    for t = 0, nb do sizes[t] = 0 end
    for i = 1, n do
      local p, t = prios[i], nb
      for k = 1, nb do
        if p >= BOUNDS[k] then t = k - 1; break end
      end
      local list, m = per_tier[t], sizes[t] + 1
      if m == 1 then list = {}; per_tier[t] = list end
      list[m] = ids[i]; sizes[t] = m
    end
    for t = 0, nb do
      if sizes[t] > 0 then bulk(cmd, ready_key(t), per_tier[t]) end
    end
  end

  -- items: list of {id, priority, seq, ...} (see lib.lua's QUEUE LAYER block).
  ready_push = function(items, front)
    if POLITE then return pol_push(items, front) end
    local n = #items
    local ids, prios, seqs = {}, {}, {}
    for i = 1, n do
      local it = items[i]
      ids[i] = it[1]; prios[i] = it[2]; seqs[i] = it[3]
    end
    push_ids(n, ids, prios, seqs, front)
  end

  -- op_push's accepted requests as aligned lists (politeness: its own queues, by items)
  if not POLITE then
    ready_push_new = function(n, ids, prios, seqs, p) push_ids(n, ids, prios, seqs, false, p) end
  end

  -- The lease's record: since, worker, ids; nil if the lease is gone, and nil, nil, nil,
  -- true if its record is corrupt (not a msgpack [since, worker, id...]).
  local function lease_info(token)
    local raw = redis.call('HGET', K_LEASES, token)
    if not raw then return nil end
    local ok, t = pcall(function() return {cmsgpack.unpack(raw)} end)
    if ok and type(t[1]) == 'table' then t = t[1] end
    if not ok or type(t[1]) ~= 'number' or type(t[2]) ~= 'string' then
      return nil, nil, nil, true
    end
    local ids = {}
    for i = 3, #t do
      if type(t[i]) ~= 'string' then return nil, nil, nil, true end
      ids[#ids + 1] = t[i]
    end
    return t[1], t[2], ids
  end

  -- (FMT.lout) The set of ids a lease's entry lists; nil if it is gone or corrupt.
  FMT.member = function(token)
    local raw = redis.call('HGET', K_LEASES, token)
    if not raw then return nil end
    local ok, t = pcall(cmsgpack.unpack, raw)
    if not ok or type(t) ~= 'table' or type(t[2]) ~= 'string' then return nil end
    local set = {}
    for i = 3, #t do set[t[i]] = true end
    return set
  end

  -- Whether id (its record corrupt) is in a ready queue, DELAYED or DEAD: if not, it was
  -- in flight when it was corrupted. O(ready) with a list scan: only for corrupt records.
  local function queued(id)
    if redis.call('ZSCORE', K_DEAD, id) or redis.call('ZSCORE', K_DELAYED, id) then
      return true
    end
    for tier = 0, NTIERS - 1 do
      local at
      if POLITE then
        -- (the record is corrupt, so its key is unreadable: every key queue of the tier)
        for _, k in ipairs(redis.call('ZRANGE', open_key(tier), 0, -1)) do
          if ORDERING == 'priority' then at = redis.call('ZSCORE', pq_key(tier, k), id)
          else at = redis.call('LPOS', pq_key(tier, k), id) end
          if at then return true end
        end
      elseif ORDERING == 'priority' then at = redis.call('ZSCORE', ready_key(tier), id)
      else at = redis.call('LPOS', ready_key(tier), id) end
      if at then return true end
    end
    return false
  end

  -- The ids of the requests IN-FLIGHT under token, found by scanning the request hash, and
  -- the corrupt records in no queue: only for a lease whose record is corrupt (O(stored
  -- requests), once per such lease).
  local function scan_held(token)
    local ids, cursor = {}, '0'
    if FMT.lout then
      -- (a record does not name its lease: held are the records in no queue, DELAYED,
      -- DEAD or other lease, O(stored requests) once)
      local elsewhere = {}
      for _, k in ipairs({K_DELAYED, K_DEAD}) do
        for _, x in ipairs(redis.call('ZRANGE', k, 0, -1)) do elsewhere[x] = true end
      end
      for tier = 0, NTIERS - 1 do
        -- (with politeness, the queue of each key in the tier's open zset)
        local qs = {ready_key(tier)}
        if POLITE then
          qs = {}
          for _, k in ipairs(redis.call('ZRANGE', open_key(tier), 0, -1)) do
            qs[#qs + 1] = pq_key(tier, k)
          end
        end
        for _, qk in ipairs(qs) do
          local q
          if ORDERING == 'priority' then q = redis.call('ZRANGE', qk, 0, -1)
          else q = redis.call('LRANGE', qk, 0, -1) end
          for _, x in ipairs(q) do elsewhere[x] = true end
        end
      end
      -- (another lease's entry may still list a request released or expired from it while
      -- it holds others: the request is that lease's only if the record's fence lets the
      -- newest lease listing it hold it; else it may be this one's)
      local listed, lc = {}, '0'
      repeat
        local r = redis.call('HSCAN', K_LEASES, lc, 'COUNT', 1000)
        lc = r[1]
        for i = 1, #r[2], 2 do
          local other = r[2][i]
          if other ~= token then
            for x in pairs(FMT.member(other) or {}) do
              local seen = listed[x]  -- (tokens are decimal counters: longer is newer)
              if not seen or #other > #seen or (#other == #seen and other > seen) then
                listed[x] = other
              end
            end
          end
        end
      until lc == '0'
      repeat
        local r = redis.call('HSCAN', K_REQ, cursor, 'COUNT', 1000)
        cursor = r[1]
        for i = 1, #r[2], 2 do
          local id = r[2][i]
          local p, _, t = parse_head(r[2][i + 1])
          local other = listed[id]
          if not elsewhere[id] and not (other and (p == nil or FMT.holds(t, other)))
              and (p == nil or FMT.holds(t, token)) then
            ids[#ids + 1] = id
          end
        end
      until cursor == '0'
      return ids
    end
    repeat
      local r = redis.call('HSCAN', K_REQ, cursor, 'COUNT', 1000)
      cursor = r[1]
      for i = 1, #r[2], 2 do
        local p, _, t = parse_head(r[2][i + 1])
        if (p ~= nil and t == token) or (p == nil and not queued(r[2][i])) then
          ids[#ids + 1] = r[2][i]
        end
      end
    until cursor == '0'
    return ids
  end

  -- The worker and ids of a lease: from its record, or, if that is corrupt, from the scan
  -- (worker nil).
  local function lease_ids(token)
    local _, worker, ids, corrupt = lease_info(token)
    if corrupt then ids = scan_held(token) end
    return worker, ids
  end

  -- Of ids, those still IN-FLIGHT under token, with their records; and those whose record
  -- is corrupt and that are in no queue (they were held when they were corrupted: DEAD).
  local function still_held(ids, token)
    local recs = hmget(K_REQ, ids)
    local held, hrecs, lost = {}, {}, {}
    for i, id in ipairs(ids) do
      if recs[i] then
        local p, _, t = parse_head(recs[i])
        if p ~= nil and FMT.holds(t, token) then held[#held + 1] = id; hrecs[#hrecs + 1] = recs[i]
        elseif p == nil and not queued(id) then lost[#lost + 1] = id end
      end
    end
    return held, hrecs, lost
  end

  -- How many requests a lease holds: its count (left), or, if that is corrupt, a recount.
  local function lease_left(token)
    local left = redis.call('HGET', K_LEFT, token)
    if int_ok(left) then return num(left) end
    local _, ids = lease_ids(token)
    local held, _, lost = still_held(ids or {}, token)
    return #held + #lost
  end

  -- A lease's requests were given back (acked, nacked or reclaimed): n fewer held. A
  -- corrupt count is first recounted from the records (already rewritten by the caller).
  local function lease_release(token, n)
    if not int_ok(redis.call('HGET', K_LEFT, token)) then
      local left = lease_left(token) + n
      redis.call('HSET', K_LEFT, token, left)
      repaired('left ' .. token .. ' recounted: ' .. left)
    end
    if redis.call('HINCRBY', K_LEFT, token, -n) <= 0 then
      redis.call('ZREM', K_INFLIGHT, token)
      redis.call('HDEL', K_LEASES, token)
      redis.call('HDEL', K_LEFT, token)
      FMT.sets[token] = nil
    end
    redis.call('HINCRBY', K_STATS, 'inflight', -n)
  end

  -- Whether the lease token covers id (whose record is corrupt, so its own token is
  -- unreadable): a worker acking, nacking or releasing a request corrupted in its hands.
  holds = function(token, id)
    local _, _, ids = lease_info(token)
    for _, x in ipairs(ids or {}) do
      if x == id then return not queued(id) end
    end
    return false
  end

  -- Leases past their deadline: extended if the worker's heartbeat is still alive, else
  -- every request still held goes back to READY (or DEAD once max_attempts deliveries
  -- are used up, or when its record was corrupted while held), its politeness slot freed.
  -- A lease whose own record is corrupt has no known worker: it is taken back. orphans: a
  -- list of lease tokens to take back now instead, whoever's heartbeat is alive (a live
  -- worker's leases it does not hold: expire_worker). Returns the number of requests taken
  -- back.
  reclaim_expired = function(limit, max_attempts, _, orphans)
    local tokens = orphans
    if not tokens then
      tokens = redis.call('ZRANGEBYSCORE', K_INFLIGHT, '-inf', NOW, 'LIMIT', 0, limit)
    end
    local taken = 0
    for _, token in ipairs(tokens) do
      local worker, ids = lease_ids(token)
      local alive = 0
      if worker and not orphans then alive = num(redis.call('HGET', K_WORKERS, worker)) end
      if alive > NOW then
        redis.call('ZADD', K_INFLIGHT, alive, token)
      else
        local held, recs, lost = {}, {}, {}
        if ids then held, recs, lost = still_held(ids, token) end
        local left = lease_left(token)
        local back, dead, whys, writes = {}, {}, {}, {}
        for i, id in ipairs(held) do
          local p, a, _, env = parse(recs[i])
          a = FMT.cur(a)  -- (the expired delivery spent: see FMT in lib.lua)
          writes[#writes + 1] = id; writes[#writes + 1] = FMT.left(p, a, token, env)
          if a >= max_attempts then
            dead[#dead + 1] = id
            whys[#whys + 1] = expired_why(a, worker)
          else
            back[#back + 1] = id
          end
        end
        for _, id in ipairs(lost) do dead[#dead + 1] = id; whys[#whys + 1] = CORRUPT end
        if #writes > 0 then bulk('HSET', K_REQ, writes) end
        if POLITE then pol_release(recs) end
        kill(dead, whys)
        requeue(back, false)
        if #back > 0 then redis.call('HINCRBY', K_STATS, 'reclaimed', #back) end
        redis.call('ZREM', K_INFLIGHT, token)
        redis.call('HDEL', K_LEASES, token)
        redis.call('HDEL', K_LEFT, token)
        FMT.sets[token] = nil
        if worker and not orphans then calls_forget(worker) end
        -- the lease's own count: a request corrupted in its hands and dead-lettered through
        -- another lease's scan still counted here
        if left > 0 then redis.call('HINCRBY', K_STATS, 'inflight', -left) end
        taken = taken + #held + #lost
      end
    end
    return taken
  end

  -- The requests of these tokens (one per request) left IN-FLIGHT.
  unhold = function(tokens, recs)
    if POLITE and recs then pol_release(recs) end
    local per_lease = {}
    for _, t in ipairs(tokens) do per_lease[t] = (per_lease[t] or 0) + 1 end
    for t, k in pairs(per_lease) do lease_release(t, k) end
  end

  -- When the lease token was granted (ms), or nil if its record is gone or corrupt.
  lease_since = function(token)
    local since = lease_info(token)
    return since
  end

  -- A lease's reclaim step: expired leases go back to READY (none is handed out directly).
  lease_expired = function(worker, n, ttl, max_attempts, limit)
    reclaim_expired(limit, max_attempts)
    return {}
  end

  -- Up to n ready ids, popped by the weighted-fair schedule over the tiers (one tier digit
  -- per slot, hex, e.g. "0102010201"; the crawl-wide cursor is its position), or by
  -- priority.
  local function pop_ready(n, schedule)
    local ids = {}
    if ORDERING == 'priority' then
      -- (the n lowest, then removed by rank: ZPOPMIN would reply with every score as text)
      if n <= 0 then return ids end
      ids = redis.call('ZRANGE', ready_key(0), 0, n - 1)
      if #ids > 0 then redis.call('ZREMRANGEBYRANK', ready_key(0), 0, #ids - 1) end
      return ids
    end
    -- Plan the picks over the schedule, skipping empty tiers, then pop per tier.
    local avail, take = {}, {}
    local total = 0
    for t = 0, NTIERS - 1 do
      avail[t] = redis.call('LLEN', ready_key(t))
      take[t] = 0
      total = total + avail[t]
    end
    if n > total then n = total end
    local cursor = num(redis.call('HGET', K_CONTROL, 'cursor'))
    local slots = #schedule
    -- (the schedule's tier digits decoded once, not a string.sub and tonumber per pick)
    local digit = {string.byte(schedule, 1, slots)}
    for i = 1, slots do
      local d = digit[i]
      if d >= 97 then d = d - 87 elseif d >= 65 then d = d - 55 else d = d - 48 end
      digit[i] = d
    end
    local picked = 0
    while picked < n do
      local t = digit[cursor % slots + 1]
      cursor = cursor + 1
      if avail[t] > take[t] then
        take[t] = take[t] + 1
        picked = picked + 1
      end
    end
    if n > 0 then redis.call('HSET', K_CONTROL, 'cursor', cursor % (slots * 1000000)) end
    local pop = (ORDERING == 'fifo') and 'RPOP' or 'LPOP'
    for t = 0, NTIERS - 1 do
      local k = take[t]
      if k > 0 and k == n then return redis.call(pop, ready_key(t), k) end  -- (one tier)
      if k > 0 then
        local got, m = redis.call(pop, ready_key(t), k), #ids
        for i = 1, #got do ids[m + i] = got[i] end
      end
    end
    return ids
  end

  -- Up to n READY requests to a worker as one lease: one token (a crawl-wide counter) for
  -- them all, with its deadline in inflight, its record (since, worker, ids) in leases and
  -- its count in left.
  lease_ready = function(worker, n, ttl, schedule, got)
    local ids, keys
    if POLITE then ids, keys = pol_grant(n, schedule)
    else ids = pop_ready(n, schedule) end
    if #ids == 0 then return end
    -- (never below the clock in microseconds, ms x 1000: a master promoted after a
    -- failover, its counter behind the old master's, hands out no token again; the same
    -- token for the same request would let the old holder's stale calls settle the new
    -- lease: docs/cluster.md, "Durability". Lua prints 10^14 as "1e+14": %.0f)
    local token = redis.call('HINCRBY', K_STATS, 'leases', 1)
    if token < math.floor(NOW) * 1000 then
      token = math.floor(NOW) * 1000
      redis.call('HSET', K_STATS, 'leases', string.format('%.0f', token))
    end
    token = string.format('%.0f', token)
    local leased = stamp_leased(ids, token, false, got)
    local kept, unused, held = {NOW, worker}, {}, 0
    for i = 1, #ids do
      if leased[i] then held = held + 1; kept[held + 2] = ids[i]
      elseif keys then unused[#unused + 1] = keys[i] end
    end
    if keys then pol_unpop(unused) end  -- popped but not leased (a missing or corrupt record)
    if held == 0 then return end
    redis.call('ZADD', K_INFLIGHT, NOW + ttl, token)
    redis.call('HSET', K_LEASES, token, cmsgpack.pack(kept))
    redis.call('HSET', K_LEFT, token, held)
    redis.call('HINCRBY', K_STATS, 'inflight', held)
  end

  -- All of a worker's leases expire now (held nil), or, held a set of lease tokens, those of
  -- its leases not in it are taken back now (disown.lua: the worker is alive, so they would
  -- never expire). Scans the leases hash (one field per lease() call of the whole fleet):
  -- an operator action, a clean shutdown, or a worker's check every few heartbeats.
  -- Returns the number of requests its leases hold (held nil) or that were taken back.
  expire_worker = function(worker, held, max_attempts)
    local n, cursor, orphans = 0, '0', {}
    repeat
      local r = redis.call('HSCAN', K_LEASES, cursor, 'COUNT', 1000)
      cursor = r[1]
      local kv = r[2]
      for i = 1, #kv, 2 do
        local _, w = lease_info(kv[i])
        if w == worker and not held then
          redis.call('ZADD', K_INFLIGHT, 0, kv[i])
          n = n + math.max(num(redis.call('HGET', K_LEFT, kv[i])), 0)
        elseif w == worker and not held[kv[i]] then
          orphans[#orphans + 1] = kv[i]
        end
      end
    until cursor == '0'
    if held then n = reclaim_expired(0, max_attempts, nil, orphans) end
    return n
  end
end
queue_layer()
