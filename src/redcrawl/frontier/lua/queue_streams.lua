-- queue_streams.lua: the streams backend's queue layer (after lib.lua, the dedupe prelude
-- and polite.lua, instead of queue_lists.lua; it defines the hooks lib.lua's QUEUE LAYER
-- block declares, and polite.lua's lease_since; nothing outside this file uses anything
-- else of it). Everything else —
-- the request hash and its record header, dedupe, DELAYED, DEAD, stats, heartbeats, pause
-- — is lib.lua's and ops.lua's, shared with the lists backend.
--
-- KEYS 13..: the streams, two per shard: KEYS[13 + 2s] is shard s's high-priority stream
-- (priority >= the first tier bound), KEYS[14 + 2s] its low one. "k" below is a stream's
-- index: k = 2s (high) or 2s + 1 (low). An entry has one field, r = the request id. A
-- request's shard is a hash of its URL's host (Python computes it at push; host_of and
-- shard_of_record below compute the same when a request comes back from DELAYED or DEAD).
--
-- One consumer group "g" per stream (the streams are the crawl's own, so one group per
-- crawl); a worker is a consumer. The group is created from the start of the stream ("0",
-- MKSTREAM) the first time a command finds it missing, so a backlog XADDed before it
-- existed is consumed, and a purged crawl starts again cleanly.
--
-- States: READY = an entry not yet delivered to the group; IN-FLIGHT = a pending entry
-- (in the group's PEL) whose request record carries the token "<lease>/<k>/<entry id>"
-- (<lease>: a crawl-wide counter, one per lease() call). An entry leaves its stream only
-- by XACK + XDEL, when its request leaves IN-FLIGHT (acked, retried, dead-lettered,
-- released) or is found stale: streams are never trimmed (no MAXLEN, no MINID), so
-- nothing unacked is ever lost, whatever the size of a producer's burst. Hence
-- ready = sum(XLEN) - sum(pending).
--
-- Leases. The delivery count of a pending entry equals its request's attempts (Redis
-- counts a claim; a first delivery of a request delivered before gets RETRYCOUNT). A
-- pending entry is expired when it has been idle for the lease ttl (idle = time since its
-- delivery or its last extension). Expired entries are found with XPENDING IDLE (6.2+);
-- those of a worker whose heartbeat (workers hash) is still alive are extended with
-- XCLAIM ... IDLE JUSTID, so that they expire when the heartbeat does (renew stays one
-- HSET, as in the lists backend); the others are claimed by the leasing worker with
-- XCLAIM min-idle (delivery count + 1), dead-lettered once max_attempts deliveries are
-- used up (with the last worker's name), or, when nobody leases them (maintain, pause),
-- put back at the end of their stream. A dead consumer is removed from the group
-- (XGROUP DELCONSUMER) once it has no pending entry left.
--
-- The test clock. Idle times are the server's real time, but tests move a clock of their
-- own (ARGV[4]). With a caller's clock, every delivery and extension backdates the entry
-- with XCLAIM ... IDLE (OFFSET + x), OFFSET = S_K - skew, skew = now_ms - server time
-- (S_K = 10^12 ms), and expiry is tested at idle >= ttl + OFFSET: then an entry expires
-- exactly when the caller's clock has moved ttl past its delivery, whatever the real
-- time. With the server clock OFFSET = 0: plain idle times, min-idle = ttl.

-- POLITENESS (layout "streams/<shards>/<key mode>", POLITE set; docs/politeness.md,
-- "Streams backend"). READY requests wait in polite.lua's per-key queues, not in the
-- streams; a lease grants ids by the open schedule (pol_grant), XADDs each to its
-- stream (its shard: a hash of its politeness key, so a site's requests share a stream)
-- and reads them into the worker's pending list (XREADGROUP) in the same script, so a
-- stream holds only granted entries, pending at once: in flight = pending, ready = the
-- per-key queues (stats "ready") + the entries not yet delivered (none, but for entries
-- left by a crawl without politeness). An entry has a second field, t = its grant time
-- (ms, the frontier's clock: lease_since). Expired entries go back to their key's queue
-- (their slot back), never straight to the leasing worker.

-- The layer is built by one call of queue_layer() below, not as closures of the main
-- chunk (see the top of queue_lists.lua: ~40k instructions a call).
local function queue_layer()
  PUSH_STRIDE = 4  -- record, fingerprint, priority, shard
  local S_GROUP = 'g'
  local S_K = 1000000000000
  local NSTREAMS = #KEYS - FIRST_TIER + 1 - POL_NKEYS
  local SHARDS = NSTREAMS / 2
  local HIGH = BOUNDS[1] or -math.huge
  local OFFSET = 0
  if ARGV[4] ~= '' then OFFSET = S_K - (NOW - server_ms()) end

  local function skey(k) return KEYS[FIRST_TIER + k] end

  -- A stream-group command; when the group (or the stream) is missing, create the group
  -- from the start of the stream and run the command again.
  local function xg(key, ...)
    local r = redis.pcall(...)
    if type(r) == 'table' and r.err then
      if string.find(r.err, 'NOGROUP', 1, true) then
        redis.call('XGROUP', 'CREATE', key, S_GROUP, '0', 'MKSTREAM')
      end
      return redis.call(...)
    end
    return r
  end

  -- The lower-cased host of a URL, exactly as redcrawl.frontier.streams.host_of.
  local function host_of(url)
    local rest = string.match(url, '^%a[%w+.-]*://(.*)$') or url
    local auth = string.match(rest, '^[^/?#]*')
    auth = string.match(auth, '([^@]*)$')
    local host
    if string.sub(auth, 1, 1) == '[' then
      host = string.match(auth, '^%[[^%]]*%]?')
    else
      host = string.match(auth, '^[^:]*')
    end
    return string.lower(host)
  end

  local function shard_of_url(url)
    return tonumber(string.sub(redis.sha1hex(host_of(url)), 1, 8), 16) % SHARDS
  end

  -- The shard of a stored record (shard 0 if its envelope can't be read: it is then
  -- dead-lettered when leased).
  local function shard_of_record(rec)
    local p, _, _, env = parse(rec or '')
    if p == nil then return 0 end
    local ok, t = pcall(cmsgpack.unpack, env)
    if ok and type(t) == 'table' and type(t.u) == 'string' then return shard_of_url(t.u) end
    return 0
  end

  local function stream_of(shard, priority)
    return 2 * (shard % SHARDS) + ((priority >= HIGH) and 0 or 1)
  end

  -- Streams are appended to: "front" (served next) has no meaning here (with politeness,
  -- the key queues of polite.lua, where it has).
  ready_push = function(items, front)
    if POLITE then return pol_push(items, front) end
    for _, it in ipairs(items) do
      local shard = it[4]
      if shard == nil then shard = shard_of_record(it[5] or redis.call('HGET', K_REQ, it[1])) end
      redis.call('XADD', skey(stream_of(shard, it[2])), '*', 'r', it[1])
    end
  end

  local function parse_token(t)
    local k, eid = string.match(t, '^%d+/(%d+)/(%d+%-%d+)$')
    if not k then return nil end
    return tonumber(k), eid
  end

  -- The token names the entry the request was delivered as; while that entry exists, the
  -- request is in flight (whoever holds it now).
  holds = function(token, id)
    local k, eid = parse_token(token)
    if not k or k >= NSTREAMS then return false end
    local r = redis.call('XRANGE', skey(k), eid, eid)
    return r[1] ~= nil and r[1][2][2] == id
  end

  -- XACK + XDEL entries of stream k: the only way an entry leaves a stream.
  local function xdone(k, eids)
    if #eids == 0 then return end
    local key = skey(k)
    for i = 1, #eids, CHUNK do
      local j = math.min(i + CHUNK - 1, #eids)
      redis.pcall('XACK', key, S_GROUP, unpack(eids, i, j))
      redis.call('XDEL', key, unpack(eids, i, j))
    end
  end

  unhold = function(tokens, recs)
    if POLITE and recs then pol_release(recs) end
    local per = {}
    for _, t in ipairs(tokens) do
      local k, eid = parse_token(t)
      if k and k < NSTREAMS then
        if not per[k] then per[k] = {} end
        per[k][#per[k] + 1] = eid
      end
    end
    for k, eids in pairs(per) do xdone(k, eids) end
  end

  -- When the lease token was granted (ms): its entry's field t (written with politeness),
  -- or nil.
  lease_since = function(token)
    local k, eid = parse_token(token)
    if not k or k >= NSTREAMS then return nil end
    local r = redis.call('XRANGE', skey(k), eid, eid)
    local f = r[1] and r[1][2]
    if f and f[3] == 't' then return tonumber(f[4]) end
    return nil
  end

  -- Expired pending entries (idle >= ttl), high streams first, at most limit. Those of a
  -- worker whose heartbeat is alive are extended to it; the others are returned as
  -- {k, entry id, consumer, delivery count}.
  local function expired(ttl, limit)
    local thr = ttl + OFFSET
    local alive, out, seen = {}, {}, 0
    for cls = 0, 1 do
      for s = 0, SHARDS - 1 do
        if seen >= limit then return out end
        local k = 2 * s + cls
        local key = skey(k)
        local p = redis.pcall('XPENDING', key, S_GROUP, 'IDLE', thr, '-', '+', limit - seen)
        if type(p) == 'table' and not p.err then
          for _, e in ipairs(p) do
            seen = seen + 1
            local c = e[2]
            if alive[c] == nil then alive[c] = num(redis.call('HGET', K_WORKERS, c)) end
            local left = alive[c] - NOW
            if left > 0 then
              local idle = OFFSET
              if left < ttl then idle = OFFSET + ttl - left end
              redis.call('XCLAIM', key, S_GROUP, c, 0, e[1], 'IDLE', idle, 'JUSTID')
            else
              out[#out + 1] = {k, e[1], c, tonumber(e[4])}
            end
          end
        end
      end
    end
    return out
  end

  local LEASE = nil
  local function lease_token(k, eid)
    if not LEASE then
      -- (never below the clock in microseconds: see lease_ready in queue_lists.lua)
      local n = redis.call('HINCRBY', K_STATS, 'leases', 1)
      if n < math.floor(NOW) * 1000 then
        n = math.floor(NOW) * 1000
        redis.call('HSET', K_STATS, 'leases', string.format('%.0f', n))
      end
      LEASE = string.format('%.0f', n)
    end
    return LEASE .. '/' .. k .. '/' .. eid
  end

  -- Expired entries of dead workers: claimed by `worker` (up to want of them; returned as a
  -- lease reply: id, attempts, record, token each), dead-lettered once max_attempts
  -- deliveries are used up, or put back at the end of their stream. Consumers left without
  -- pending entries are removed from the group, but keep (a live worker: expire_worker
  -- with held).
  -- Returns (claimed, number of requests taken back).
  local function reclaim(cands, max_attempts, ttl, worker, want, keep)
    local got, taken, back = {}, 0, 0
    local owners = {}
    for _, c in ipairs(cands) do
      local k, eid, owner, count = c[1], c[2], c[3], c[4]
      local key = skey(k)
      local claim = worker ~= nil and #got < 4 * want
      local r
      if claim then
        if OFFSET > 0 then
          r = redis.call('XCLAIM', key, S_GROUP, worker, ttl + OFFSET, eid, 'IDLE', OFFSET)
        else
          r = redis.call('XCLAIM', key, S_GROUP, worker, ttl, eid)
        end
      else
        r = redis.call('XRANGE', key, eid, eid)
      end
      local rid = r[1] and r[1][2] and r[1][2][2]
      if rid then
        if not owners[k] then owners[k] = {} end
        owners[k][owner] = true
        local rec = redis.call('HGET', K_REQ, rid)
        local p, a, t, env
        if rec then p, a, t, env = parse(rec) end
        local ok, tk = p ~= nil and t ~= '', nil
        if ok then
          local tk_k, tk_eid = parse_token(t)
          ok = tk_k == k and tk_eid == eid
        end
        if rec and p == nil then
          xdone(k, {eid})
          kill({rid}, {CORRUPT})
          taken = taken + 1
        elseif not ok then
          xdone(k, {eid})  -- a stale entry: its request is elsewhere (or gone)
        elseif a >= max_attempts then
          xdone(k, {eid})
          redis.call('HSET', K_REQ, rid, header(p, a, '', env))
          if POLITE then pol_release({rec}) end
          kill({rid}, {expired_why(a, owner)})
          taken = taken + 1
        elseif claim then
          if count ~= a then
            redis.call('XCLAIM', key, S_GROUP, worker, 0, eid, 'RETRYCOUNT', a + 1, 'JUSTID')
          end
          tk = lease_token(k, eid)
          rec = header(p, a + 1, tk, env)
          redis.call('HSET', K_REQ, rid, rec)
          got[#got + 1] = rid; got[#got + 1] = a + 1; got[#got + 1] = rec; got[#got + 1] = tk
          back = back + 1
          taken = taken + 1
        elseif POLITE then
          -- its slot back, and to the front of its key's queue
          xdone(k, {eid})
          pol_release({rec})
          local nrec = header(p, a, '', env)
          redis.call('HSET', K_REQ, rid, nrec)
          pol_push({{rid, p, 0, nil, nrec}}, true)
          back = back + 1
          taken = taken + 1
        else
          xdone(k, {eid})
          redis.call('HSET', K_REQ, rid, header(p, a, '', env))
          redis.call('XADD', key, '*', 'r', rid)
          back = back + 1
          taken = taken + 1
        end
      elseif not (r[1] and r[1][1]) then
        redis.pcall('XACK', key, S_GROUP, eid)  -- pending, but the entry is gone
      end
    end
    if back > 0 then redis.call('HINCRBY', K_STATS, 'reclaimed', back) end
    for k, set in pairs(owners) do
      for owner in pairs(set) do
        if owner ~= worker and owner ~= keep then
          local left = redis.call('XPENDING', skey(k), S_GROUP, '-', '+', 1, owner)
          if #left == 0 then
            redis.call('XGROUP', 'DELCONSUMER', skey(k), S_GROUP, owner)
            calls_forget(owner)
          end
        end
      end
    end
    return got, taken
  end

  -- maintain: expired entries of dead workers back to READY (or DEAD), and consumers of
  -- the group that are dead (no heartbeat) with nothing pending removed from it.
  reclaim_expired = function(limit, max_attempts, ttl)
    local _, taken = reclaim(expired(ttl, limit), max_attempts, ttl, nil, 0)
    for k = 0, NSTREAMS - 1 do
      local key = skey(k)
      local cs = redis.pcall('XINFO', 'CONSUMERS', key, S_GROUP)
      if type(cs) == 'table' and not cs.err then
        for _, c in ipairs(cs) do
          local name, pending
          for i = 1, #c, 2 do
            if c[i] == 'name' then name = c[i + 1]
            elseif c[i] == 'pending' then pending = c[i + 1] end
          end
          if name and pending == 0
             and num(redis.call('HGET', K_WORKERS, name)) <= NOW then
            redis.call('XGROUP', 'DELCONSUMER', key, S_GROUP, name)
            calls_forget(name)
          end
        end
      end
    end
    return taken
  end

  -- A lease's reclaim step: expired entries of dead workers, up to n of them claimed by
  -- worker (their delivery count + 1; none with politeness: they go through their keys'
  -- queues), the others back to READY or DEAD.
  lease_expired = function(worker, n, ttl, max_attempts, limit)
    local claimer = n > 0 and not POLITE and worker or nil
    local got = reclaim(expired(ttl, limit), max_attempts, ttl, claimer, n)
    return got
  end

  -- Up to n new entries (XREADGROUP ">"), high-priority streams before low ones, spread over
  -- the shards from a rotating start, appended to fresh as {stream, entry id, request id}.
  local function read_new(worker, n, fresh)
    -- a fair split over the shards, then whatever is left from any of them
    local cursor = num(redis.call('HGET', K_CONTROL, 'cursor')) % SHARDS
    local drained = {}
    local need = n
    for cls = 0, 1 do
      for round = 1, 2 do
        for i = 0, SHARDS - 1 do
          if need <= 0 then break end
          local k = 2 * ((cursor + i) % SHARDS) + cls
          if not drained[k] then
            local key = skey(k)
            local q = need
            if round == 1 then q = math.ceil(need / (SHARDS - i)) end
            local r = false
            if redis.call('EXISTS', key) == 1 then
              r = xg(key, 'XREADGROUP', 'GROUP', S_GROUP, worker, 'COUNT', q, 'STREAMS', key, '>')
            end
            local entries = (r and r[1] and r[1][2]) or {}
            if #entries < q then drained[k] = true end
            for _, e in ipairs(entries) do
              fresh[#fresh + 1] = {k, e[1], e[2][2]}
            end
            need = need - #entries
          end
        end
      end
    end
    redis.call('HSET', K_CONTROL, 'cursor', (cursor + 1) % SHARDS)
  end

  -- With politeness: up to n ids granted by the open schedule (polite.lua's pol_grant),
  -- each XADDed to its stream (its shard a hash of its key; high stream for tier 0) and
  -- read at once into the worker's pending list; appended to fresh as {stream, entry id,
  -- request id, key}. False if nothing was granted.
  local function polite_deliver(worker, n, schedule, fresh)
    local ids, keys, tiers = pol_grant(n, schedule)
    if #ids == 0 then return false end
    local shard, added, order, key_of = {}, {}, {}, {}
    for i, id in ipairs(ids) do
      local key = keys[i]
      local s = shard[key]
      if not s then
        s = tonumber(string.sub(redis.sha1hex(key), 1, 8), 16) % SHARDS
        shard[key] = s
      end
      local k = 2 * s + ((tiers[i] == 0) and 0 or 1)
      local eid = redis.call('XADD', skey(k), '*', 'r', id, 't', NOW)
      key_of[eid .. '@' .. k] = key
      if not added[k] then added[k] = 0; order[#order + 1] = k end
      added[k] = added[k] + 1
    end
    for _, k in ipairs(order) do
      local key = skey(k)
      local r = xg(key, 'XREADGROUP', 'GROUP', S_GROUP, worker, 'COUNT', added[k],
                   'STREAMS', key, '>')
      for _, e in ipairs((r and r[1] and r[1][2]) or {}) do
        fresh[#fresh + 1] = {k, e[1], e[2][2], key_of[e[1] .. '@' .. k]}
      end
    end
    return true
  end

  -- Up to n requests to the worker: new entries of the streams (read_new) or, with
  -- politeness, granted ones (polite_deliver); schedule: the tiers' weighted-fair schedule
  -- (politeness only).
  lease_ready = function(worker, n, ttl, schedule, got)
    local fresh = {}
    if POLITE then
      if not polite_deliver(worker, n, schedule, fresh) then return end
    else
      read_new(worker, n, fresh)
    end

    local ids = {}
    for i, f in ipairs(fresh) do ids[i] = f[3] end
    local leased = stamp_leased(ids, function(i) return lease_token(fresh[i][1], fresh[i][2]) end,
                                true, got)
    local fix, unused = {}, {}
    for i, f in ipairs(fresh) do
      local k, eid, a = f[1], f[2], leased[i]
      if not a then
        xdone(k, {eid})  -- dead-lettered (corrupt), or stale: its request is elsewhere (or gone)
        if f[4] then unused[#unused + 1] = f[4] end  -- granted: its slot back
      elseif a ~= 1 or OFFSET > 0 then
        local key = k .. ':' .. a
        if not fix[key] then fix[key] = {k, a, {}} end
        local list = fix[key][3]
        list[#list + 1] = eid
      end
    end
    if POLITE then pol_unpop(unused) end
    -- The delivery count is the request's attempts; with a test clock, backdate the idle.
    for _, f in pairs(fix) do
      local eids = f[3]
      for i = 1, #eids, CHUNK do
        local args = {'XCLAIM', skey(f[1]), S_GROUP, worker, 0,
                      unpack(eids, i, math.min(i + CHUNK - 1, #eids))}
        if OFFSET > 0 then args[#args + 1] = 'IDLE'; args[#args + 1] = OFFSET end
        args[#args + 1] = 'RETRYCOUNT'; args[#args + 1] = f[2]
        args[#args + 1] = 'JUSTID'
        redis.call(unpack(args))
      end
    end
  end

  -- All of a worker's pending entries expire now (held nil: XCLAIM ... IDLE far in the
  -- past, JUSTID: the delivery count is kept), so the next lease/maintain call reclaims them
  -- and then removes the consumer from the group. held a set of lease tokens: those of its
  -- pending entries none of them names are taken back now instead, as expired entries of a
  -- dead worker would be (disown.lua: the worker is alive, so they would never expire).
  -- O(its pending entries). Returns the number of entries expired, or taken back.
  expire_worker = function(worker, held, max_attempts, ttl)
    local n, mine, cands = 0, {}, {}
    for t in pairs(held or {}) do
      local k, eid = parse_token(t)
      if k then mine[k .. '/' .. eid] = true end
    end
    for k = 0, NSTREAMS - 1 do
      local key = skey(k)
      local p = redis.pcall('XPENDING', key, S_GROUP, '-', '+', 1000000, worker)
      if held and type(p) == 'table' and not p.err then
        for _, e in ipairs(p) do
          if not mine[k .. '/' .. e[1]] then
            cands[#cands + 1] = {k, e[1], worker, tonumber(e[4])}
          end
        end
      elseif type(p) == 'table' and not p.err and #p > 0 then
        local eids = {}
        for i, e in ipairs(p) do eids[i] = e[1] end
        for i = 1, #eids, CHUNK do
          local args = {'XCLAIM', key, S_GROUP, worker, 0,
                        unpack(eids, i, math.min(i + CHUNK - 1, #eids))}
          args[#args + 1] = 'IDLE'; args[#args + 1] = OFFSET + 100000000000
          args[#args + 1] = 'JUSTID'
          redis.call(unpack(args))
        end
        n = n + #p
      end
    end
    if held then
      local _
      _, n = reclaim(cands, max_attempts, ttl, nil, 0, worker)
    end
    return n
  end
end
queue_layer()
