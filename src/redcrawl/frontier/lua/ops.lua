-- ops.lua: the frontier's batch operations as functions (after lib.lua, the dedupe prelude
-- and the queue layer), so that a worker can store, acknowledge and lease in one script
-- call (settle.lua) and each operation also has a script of its own.

-- The queue layer must define every hook lib.lua's QUEUE LAYER block declares.
if not (PUSH_STRIDE and ready_push and unhold and holds and lease_expired and lease_ready
        and reclaim_expired and expire_worker) then
  return redis.error_reply('frontier scripts: the queue layer for "' .. ORDERING .. '" ' ..
    'does not define every hook of the QUEUE LAYER block in lib.lua; reinstall redcrawl')
end
-- Every pushed request ends with two fields of the dedupe's: the member and level-0
-- bucket of its fingerprint (exact mode, DedupeSpec.hints: the member as decimal text,
-- the bucket as its key without generations, as its number with them), "" otherwise.
PUSH_STRIDE = PUSH_STRIDE + 2

-- The lease reply of both backends is one flat list: id, attempts, record, token of each
-- leased request.

-- Dedupe and enqueue the requests given as ARGV PUSH_STRIDE-tuples (record
-- "<priority>|0||<envelope>", fingerprint or "" for no dedupe, priority, then the queue
-- layer's own: see lib.lua, then the fingerprint's dedupe member and bucket or "", "")
-- starting at ARGV[first], n of them.
-- A request is a duplicate if its fingerprint is DONE or already stored (READY, DELAYED,
-- IN-FLIGHT or DEAD), earlier in this batch included.
-- delay_ms > 0: accepted requests wait in DELAYED that long instead of going READY.
-- recrawl: DONE fingerprints do not count as duplicates (stored ones still do).
-- stamped: each record ends with its push stamp already (settle.lua's ARGV[16]); kept as
-- it is (a crawl without push stamps, FMT.stamps false: cut off), where otherwise this
-- appends push_stamp() to each (a new record-sized Lua string: ~2.9k instructions).
-- Returns one character per request: "1" accepted, "0" duplicate.
local function op_push(first, n, delay_ms, recrawl, stamped)
  if n == 0 then return '' end
  -- One HMGET for every fingerprint and one HSET for every new record (not an HSETNX per
  -- request): a fingerprint stored already, or earlier in this batch, is a duplicate, and
  -- only the others are looked up in the DONE filter.
  -- (the member and bucket come as ARGV of their own, "" if the client sent none: a
  -- hinted fingerprint split in Lua cost ~3.7k instructions, three string.sub)
  -- (per request, this runs for every request pushed: counters instead of #t + 1, which
  -- is a binary search, ARGV read through a local, and few tables: each write that grows
  -- one costs ~200 instructions, a table per request ~1.6k. fps and fp_at list the
  -- fingerprints and the ARGV positions of their requests, then, compacted in place, the
  -- fresh ones: not stored, first of the batch)
  local argv, stride = ARGV, PUSH_STRIDE
  local fps, fp_at, j = {}, {}, 0
  local last = first + stride * (n - 1)
  for at = first, last, stride do
    local fp = argv[at + 1]
    if fp ~= '' then j = j + 1; fps[j] = fp; fp_at[j] = at end
  end
  local stored = hmget(K_REQ, fps)
  local seen, k = {}, 0
  for x = 1, j do
    local fp = fps[x]
    if not stored[x] and not seen[fp] then
      seen[fp] = true
      k = k + 1
      if k < x then fps[k] = fp; fp_at[k] = fp_at[x] end
    end
  end
  for x = k + 1, j do fps[x] = nil; fp_at[x] = nil end
  -- (the dedupe reads each fresh fingerprint's member and bucket at its ARGV: the last
  -- two fields of its request)
  local done = recrawl and {} or dd_done_flags(fps, nil, nil, fp_at, stride - 2)
  local seq = redis.call('HINCRBY', K_STATS, 'seq', n) - n
  -- (FMT.lout: a fingerprint's record gets the last lease token as its fence, see FMT,
  -- where one acked before can be accepted again: with recrawl, or once the DONE filter
  -- forgets it, RECRAWL_AFTER; otherwise no lease that ever held it lists it live)
  local fence = FMT.lout and (recrawl or DD_GEN_MS > 0) and
    redis.call('HGET', K_STATS, 'leases')
  if fence == '0' or not int_ok(fence) then fence = nil end
  -- The accepted requests, as the queue layer's ready_push_new takes them (aligned
  -- lists; seqs only for strict priority), or as ready_push's items. (The usual batch,
  -- every request a fresh fingerprint, none DONE, one priority, keeps neither list: its
  -- ids are fps, and p1 its priority; each is filled in from where that stops holding.)
  local cols = ready_push_new ~= nil and delay_ms <= 0
  local want_seq = ORDERING == 'priority'
  local flags, writes, ids, prios, seqs, items = {}, {}, {}, nil, {}, {}
  local plain, p1 = true, nil
  -- push time: latency.lua, lib.lua
  local stamp, unstamp = (FMT.stamps and not stamped) and push_stamp() or '', false
  if stamped and not FMT.stamps then unstamp = true end
  local nums, w, m, x, nextat = NUM_TEXT, 0, 0, 1, fp_at[1]
  local i = 0
  for at = first, last, stride do
    i = i + 1
    local id
    if at == nextat then  -- a fresh fingerprint (fp_at is in ARGV order)
      if not done[x] then id = fps[x] end
      x = x + 1; nextat = fp_at[x]
    elseif argv[at + 1] == '' then
      id = '#' .. (seq + i)
    end
    if id then
      local rec = argv[at]
      if fence and #id == 20 then  -- (a fingerprint: is_fingerprint)
        -- ("<priority>|0||<envelope>": the fence goes between the two bars)
        local bars = string.find(rec, '||', 1, true)
        if bars then rec = string.sub(rec, 1, bars) .. fence .. string.sub(rec, bars + 1) end
      end
      if stamp ~= '' then rec = rec .. stamp elseif unstamp then rec = string.sub(rec, 1, -9) end
      -- (priorities and shards through the per-call table of decimal texts: few values)
      local ptext = argv[at + 2]
      local priority = nums[ptext]
      if not priority then priority = tonumber(ptext); nums[ptext] = priority end
      writes[w + 1] = id; writes[w + 2] = rec; w = w + 2
      m = m + 1
      if cols then
        if plain and id ~= fps[m] then
          plain = false
          for y = 1, m - 1 do ids[y] = fps[y] end
        end
        if not plain then ids[m] = id end
        if m == 1 then p1 = priority
        elseif prios then prios[m] = priority
        elseif priority ~= p1 then
          prios = {}
          for y = 1, m - 1 do prios[y] = p1 end
          prios[m] = priority
        end
        if want_seq then seqs[m] = seq + i end
      else
        local shard
        if stride > 5 then
          local stext = argv[at + 3]
          shard = nums[stext]
          if not shard then shard = tonumber(stext); nums[stext] = shard end
        end
        items[m] = {id, priority, seq + i, shard, rec}
      end
    else
      flags[i] = '0'  -- (accepted ones are filled in at the end, if any was not)
    end
  end
  if w > 0 then bulk('HSET', K_REQ, writes) end
  if delay_ms > 0 then
    local z = {}
    for y = 1, m do z[2 * y - 1] = NOW + delay_ms; z[2 * y] = items[y][1] end
    if m > 0 then bulk('ZADD', K_DELAYED, z) end
  elseif cols then
    if plain then  -- (fps lists the k fresh fingerprints: DONE ones after the m-th too)
      for y = m + 1, k do fps[y] = nil end
      ids = fps
    end
    ready_push_new(m, ids, prios, seqs, p1)
  else
    ready_push(items, false)
  end
  if m > 0 then redis.call('HINCRBY', K_STATS, 'accepted', m) end
  if m == n then return string.rep('1', n) end
  redis.call('HINCRBY', K_STATS, 'filtered', n - m)
  for y = 1, n do
    if not flags[y] then flags[y] = '1' end
  end
  return table.concat(flags)
end

-- A request whose record was corrupted while a worker held it, given back (ack, nack,
-- release) under a token that covers it: to DEAD, out of its lease. Returns true if so.
local function kill_corrupt_held(id, token)
  if token == '' or not holds(token, id) then return false end
  kill({id}, {CORRUPT})
  unhold({token})
  return true
end

-- Hand up to n READY requests to a worker (READY -> IN-FLIGHT), after promoting due
-- DELAYED requests and dealing with expired leases (the queue layer's lease_expired may
-- hand some of them to this worker), then renewing the worker's heartbeat (after the
-- reclaim: a worker's own expired leases count as expired) and taking the rest from READY
-- (lease_ready). ttl: lease ttl (ms); schedule: weighted-fair schedule of the tiers, one
-- hex digit per slot, e.g. "0102010201"; limit: most leases to reclaim / delayed requests
-- to promote in this call. Returns the lease reply (empty when paused).
local function op_lease(worker, n, ttl, max_attempts, schedule, limit)
  promote_due(limit)
  if n < 0 or PAUSED then n = 0 end  -- (read by the prelude: lib.lua)
  local got = lease_expired(worker, n, ttl, max_attempts, limit)
  local deadline = NOW + ttl
  if deadline > num(redis.call('HGET', K_WORKERS, worker)) then
    redis.call('HSET', K_WORKERS, worker, deadline)
  end
  if #got < 4 * n then lease_ready(worker, n - #got / 4, ttl, schedule, got) end
  return got
end

-- IN-FLIGHT -> DONE for the ARGV pairs (id, token) starting at ARGV[first], n of them.
-- A request no longer held under that token (its lease expired and it was handed out
-- again, or it was already acked) is left alone. With refuse, nothing is acked.
-- Returns one character per pair: "1" acked, "0" stale, "2" refused.
local function op_ack(first, n, refuse)
  if n == 0 then return '' end
  if refuse then return string.rep('2', n) end
  -- (a fingerprint id may come with its dedupe member and bucket: dd_unhint, common.lua)
  local argv = ARGV
  local ids, tokens, hm, hb = {}, {}, {}, {}
  for i = 1, n do
    ids[i], hm[i], hb[i] = dd_unhint(argv[first + 2 * i - 2])
    tokens[i] = argv[first + 2 * i - 1]
  end
  local recs = hmget(K_REQ, ids)
  local ok, fps, fps_m, fps_b, held, flags, seen = {}, {}, {}, {}, {}, {}, {}
  local no, nf = 0, 0
  for i = 1, n do
    flags[i] = '0'
    local id, rec = ids[i], recs[i]
    if rec and not seen[id] then
      local t = head_token(rec)
      if t == nil then
        seen[id] = kill_corrupt_held(id, tokens[i]) or nil
      elseif FMT.held(id, t, tokens[i]) then
        seen[id] = true
        flags[i] = '1'
        no = no + 1
        ok[no] = id
        held[no] = tokens[i]
        recs[no] = rec  -- (recs[1..no] become the acked records: no <= i, read already)
        if #id == 20 then  -- a fingerprint (is_fingerprint)
          nf = nf + 1
          fps[nf] = id; fps_m[nf] = hm[i]; fps_b[nf] = hb[i]
        end
      end
    end
  end
  for i = no + 1, n do recs[i] = nil end
  local hrecs = recs
  if no > 0 then
    bulk('HDEL', K_REQ, ok)
    if redis.call('EXISTS', K_ERR) == 1 then bulk('HDEL', K_ERR, ok) end
    defers_forget(ok)
    dd_mark_done(fps, fps_m, fps_b)
    unhold(held, hrecs)
    redis.call('HINCRBY', K_STATS, 'done', no)
    latency_observe(hrecs)
  end
  return table.concat(flags)
end

-- Slots given back at response time, for the ARGV triples (id, token, outcome) starting
-- at ARGV[first], n of them (see slot_free in lib.lua; nothing without politeness).
-- Returns how many slots went back.
local function op_free(first, n)
  if n == 0 or not slot_free then return 0 end
  local items = {}
  for i = 0, n - 1 do
    items[#items + 1] = {ARGV[first + 3 * i], ARGV[first + 3 * i + 1], ARGV[first + 3 * i + 2]}
  end
  return slot_free(items)
end

-- Every state-changing call (push, lease, settle, nack, release, requeue_dead) carries a
-- nonce, fresh for each call; redis-py sends the same call again when the connection
-- drops or times out before the reply arrives, and the first execution may well have
-- happened. call_replay answers such a retry with the first execution's outcome: the same
-- push and ack flags, and of what it leased, what the worker still holds under it
-- (nothing is pushed, acked or leased again). Without this a lost lease reply would leave
-- requests IN-FLIGHT under a live worker that does not know it holds them, renewed by its
-- heartbeat forever, and a lost push reply would enqueue dont_filter requests twice. A
-- worker's calls rotate over CALL_SLOTS slots (the nonce's first byte), so that a worker
-- with several calls on their way (settle_begin) can have any of them retried; calls
-- without a worker (a push from the API) use one of 256 shared slots "#~<byte>", picked
-- by a random first byte.
local function call_field(worker, nonce)
  if worker == '' then return '#~' .. string.byte(nonce, 1) end
  return worker .. '#' .. (string.byte(nonce, 1) % CALL_SLOTS)
end

-- The stored record of the call (worker, nonce), unpacked; nil if it is not (or no
-- longer) in its slot.
local function call_get(worker, nonce)
  if nonce == '' then return nil end
  local raw = redis.call('HGET', K_CALLS, call_field(worker, nonce))
  -- the nonce comes first, outside the msgpack: most calls are not retries
  if not raw or string.sub(raw, 1, #nonce) ~= nonce then return nil end
  local ok, t = pcall(cmsgpack.unpack, string.sub(raw, #nonce + 1))
  if not ok or type(t) ~= 'table' or type(t[2]) ~= 'string' then return nil end
  return t
end

-- Whether the call (worker, nonce) ran, and with its own predecessor run (a settle whose
-- predecessor did not run marks its ack flags with a trailing "!"). A pipelined settle
-- names the call before it, so that it does not acknowledge parents whose children were
-- in a call Redis refused, or in any call after that one in the same pipeline (see
-- settle.lua).
local function call_ran(worker, nonce)
  local t = call_get(worker, nonce)
  return t ~= nil and string.sub(t[2], -1) ~= '!'
end

-- Returns nil (not a retry), or {push flags, ack flags, lease reply}.
local function call_replay(worker, nonce)
  local t = call_get(worker, nonce)
  if not t then return nil end
  local ids, tokens = {}, {}
  if #t == 3 then
    -- (FMT.lout) the call leased one lease whole: its entry in leases lists the ids
    local raw = redis.call('HGET', K_LEASES, t[3])
    local ok, e = pcall(cmsgpack.unpack, raw or '')
    if ok and type(e) == 'table' then
      for i = 3, #e do ids[i - 2] = e[i]; tokens[i - 2] = t[3] end
    end
  else
    for i = 3, #t, 2 do ids[#ids + 1] = t[i]; tokens[#tokens + 1] = t[i + 1] end
  end
  local recs = hmget(K_REQ, ids)
  local got = {}
  for i, id in ipairs(ids) do
    local token = tokens[i]
    if recs[i] then
      local p, a, tk = parse_head(recs[i])
      if p ~= nil and FMT.held(id, tk, token) then
        got[#got + 1] = id; got[#got + 1] = FMT.cur(a); got[#got + 1] = recs[i]
        got[#got + 1] = token
      end
    end
  end
  return {t[1], string.gsub(t[2], '!$', ''), got}
end

-- Remember a worker's call (see call_replay): its nonce, flags and what it leased
-- (broken: its predecessor did not run, see call_ran). What it leased is kept as
-- (id, token) pairs, or, where the lease's entry in leases lists the same ids and a
-- request is held only while that entry lists it (FMT.lout), as the lease's token
-- alone: a lists lease of up to REDCRAWL_BATCH_SIZE requests is one entry made by this
-- call (lease_ready), and packing its pairs again cost ~2k instructions per request.
local function call_record(worker, nonce, pushed, acked, leased, broken)
  if nonce == '' then return end
  local t = {pushed, acked .. (broken and '!' or '')}
  local n = #leased
  local one = FMT.lout and n > 0 and leased[4]
  if one then
    for i = 8, n, 4 do
      if leased[i] ~= one then one = false; break end
    end
  end
  if one then
    t[3] = one
  else
    for i = 1, n, 4 do t[#t + 1] = leased[i]; t[#t + 1] = leased[i + 3] end
  end
  redis.call('HSET', K_CALLS, call_field(worker, nonce), nonce .. cmsgpack.pack(t))
end
