-- polite.lua: fleet-wide politeness, shared by both queue layers (after lib.lua and the
-- dedupe prelude, before queue_lists.lua or queue_streams.lua; docs/politeness.md). It
-- defines functions only (and, for a crawl with politeness, recounts a corrupt ready
-- counter); each queue layer calls them where READY and IN-FLIGHT change:
--   pol_push(items, front)  READY: into the requests' key queues (the layer's ready_push)
--   pol_grant(n, schedule)  up to n ids whose keys are open now, their keys and tiers: each
--                           takes a slot of its key and charges its delay (lease_ready)
--   pol_unpop(keys)         slots back of granted ids that were not leased after all
--   pol_release(recs)       slots back of requests leaving IN-FLIGHT (unhold, expiry)
-- and the optional hooks slot_free (a slot back at response time) and defer_held
-- (429/503) of lib.lua's QUEUE LAYER block. charge.lua uses limits, opens_at and pol_gap
-- (the gap a start charges) and pol_fail (a key's site pushed back: blocked). The queue layer defines lease_since(token) (declared here): when a
-- lease token was granted (ms), or nil.
--
-- KEYS: a crawl with politeness (POLITE set: layout "<ordering>/<mode>" for lists,
-- "streams/<shards>/<mode>" for streams) ends its KEYS with the open zset of each tier,
-- the per-key queue base, the per-key state base (bases, not keys: names are built from
-- them, in the crawl's hash tag), overrides (polo), DOWNLOAD_SLOTS (pols), blocked keys
-- (polb) and deferral counts (defers): POL_NKEYS keys (redcrawl.keys.CrawlKeys).
--
-- The ready requests of a tier are kept per politeness key (the key is in each record,
-- rec_key): the queue of key K in tier t is K_PQ .. t .. ':' .. K (FIFO on streams
-- crawls), and the tier's open zset holds every key with ready requests in that tier,
-- scored by the time (ms) it may next be granted: max(next, block_until) while it has a
-- free slot, OPEN_FULL while its slots are all taken (an ack brings it back), now +
-- PAUSE_RECHECK while an override pauses it. A lease takes the key of lowest score:
-- O(log keys) per grant; a key without ready requests is in no zset and costs nothing.
-- Per key, the hash K_POL .. K holds "in" (in flight) and "next" (ms); it expires once
-- the key is idle. The key's limits: the crawl's defaults (control "politeness"), its
-- DOWNLOAD_SLOTS entry (K_POLS), then the override hash K_POLO (crawl_delay: the larger
-- of it and the configured delay, and a floor under the jitter; delay, concurrency: win
-- outright; block_until; paused).
local TWO32 = 4294967296
-- What the rest of a script uses (nil for a crawl without politeness).
local K_POL, K_POLO
local open_key, pq_key, limits, pol_state, opens_at, pol_rescore, pol_idle_check
local pol_release, pol_push, pol_grant, pol_unpop, pol_gap, pol_fail
-- When the lease token was granted (ms), or nil if unknown: the queue layer's.
local lease_since
-- Everything else is defined only for a crawl with politeness, inside one function (a
-- closure made in a function takes the function's upvalues as they are; one made at the
-- top of a script searches the list of every open upvalue of the script for each of its
-- own: docs/politeness.md, "Cost"), whose locals end with it.
if POLITE then
  K_POL, K_POLO, open_key, pq_key, limits, pol_state, opens_at, pol_rescore, pol_idle_check,
    pol_release, pol_push, pol_grant, pol_unpop, pol_gap, pol_fail = (function()
  local OPEN_FULL = 4503599627370496  -- 2^52: not open until one of its leases ends
  local PAUSE_RECHECK = 1000
  local IDLE_TTL = 3600000
  local K_OPEN, K_PQ, K_POLS, K_POLB
  -- the order of the per-key queues: the lists crawl's ordering; FIFO on streams crawls
  local QORDER = ORDERING
  if string.sub(ORDERING, 1, 8) == 'streams/' then QORDER = 'fifo' end
  -- What one call works out once (docs/politeness.md, "Cost": a number turned into text,
  -- by Lua or by redis.call, costs as much as a small command, so the texts a call writes
  -- again and again are made once): now_s, NOW as redis.call would write it; full_s,
  -- OPEN_FULL's; pq, each tier's key queue prefix; nums, the numbers read from the state
  -- (fnum); def, the crawl's default limits (pol_defaults); deflim, a key's limits when
  -- nothing is set per key; slots, ovr: whether any DOWNLOAD_SLOTS entry or override
  -- exists; backoff, window, seed (backoff_policy, start_window, jitter_factor).
  local PC = {nums = {}, pq = {}}
  K_OPEN = #KEYS - POL_NKEYS + 1
  K_PQ = KEYS[K_OPEN + NTIERS]
  K_POL = KEYS[K_OPEN + NTIERS + 1]
  K_POLO = KEYS[K_OPEN + NTIERS + 2]
  K_POLS = KEYS[K_OPEN + NTIERS + 3]
  K_POLB = KEYS[K_OPEN + NTIERS + 4]
  K_DEFERS = KEYS[K_OPEN + NTIERS + 5]
  PC.now_s = string.format('%.17g', NOW)
  PC.full_s = '4503599627370496'  -- (OPEN_FULL as %.17g writes it)
  local function open_key(tier) return KEYS[K_OPEN + tier] end
  local function pq_key(tier, key)
    local p = PC.pq[tier]
    if not p then p = K_PQ .. tier .. ':'; PC.pq[tier] = p end
    return p .. key
  end

  -- A stored integer (a count, a time in ms) as a number, nil when absent or not a whole
  -- number (as num() reads, at a tenth of its cost when the same text comes again: no
  -- pattern, and each distinct text converted once per call).
  local NUMS = PC.nums
  local function fnum(v)
    if not v then return nil end
    local n = NUMS[v]
    if n == nil then
      n = tonumber(v)
      if not (n and n % 1 == 0 and n > -1e15 and n < 1e15) then n = false end
      NUMS[v] = n
    end
    return n or nil
  end

  -- A score (ms) as the text redis.call would send for it.
  local function score_s(s)
    if s == NOW then return PC.now_s end
    if s == OPEN_FULL then return PC.full_s end
    return string.format('%.17g', s)
  end

  -- A JSON object from the state (nil if absent or unreadable: a bad value is ignored,
  -- with a line in the server log, rather than stopping the crawl).
  local function json_obj(raw, what)
    if not raw then return nil end
    local ok, v = pcall(cjson.decode, raw)
    if ok and type(v) == 'table' then return v end
    redis.log(redis.LOG_WARNING, 'redcrawl: ignoring unreadable politeness ' .. what)
    return nil
  end
  local function pos_num(v, low, high)
    if type(v) == 'number' and v == v and v >= low and v <= high then return v end
    return nil
  end

  local LIMITS = {}
  -- key -> its state's "ad" (AutoThrottle's delay, ms; false: none), read with the state
  -- (pol_state), so that a grant reads no override for it
  local AUTO_DELAY = {}
  -- The crawl's default limits {conc, delay (s), jitter, auto} (PC.def), read once per call.
  local function pol_defaults()
    if PC.def then return PC.def end
    -- missing (stored at a frontier's first push; gone after a purge until the next one
    -- or a worker's start): Scrapy's defaults, 8 at a time and no delay; unreadable: the
    -- most careful limit, one at a time, until a worker stores its settings again
    local raws = redis.call('HMGET', K_CONTROL, 'politeness', 'autothrottle')
    local raw = raws[1]
    local d = json_obj(raw, 'defaults') or {}
    local conc = pos_num(d.concurrency, 1, 1e9) or (raw and 1 or 8)
    -- fleet-wide AutoThrottle (redcrawl.politeness.autothrottle): while a worker has it
    -- on, a key's delay is at least its state's "ad", else the start delay
    local at = json_obj(raws[2], 'autothrottle')
    local auto = at and (pos_num(at.start_delay, 0, 1e9) or 0)
    -- jitter: its range j (a gap is the delay times U(1 - j, 1 + j)), false for none
    local j = d.randomize == true and (pos_num(d.jitter, 0, 100) or 0.5)
    PC.def = {conc, pos_num(d.delay, 0, 1e9) or 0, j ~= 0 and j, auto}
    -- (most crawls have no per-key settings or overrides: no lookup per key then)
    PC.slots = redis.call('EXISTS', K_POLS) == 1
    PC.ovr = redis.call('EXISTS', K_POLO) == 1
    -- every key's limits then (AutoThrottle off): one table for all
    if not (PC.slots or PC.ovr or auto) then
      local delay = PC.def[2]
      PC.deflim = {math.floor(conc), math.floor(delay * 1000 + 0.5), PC.def[3], 0, false}
    end
    return PC.def
  end
  -- The key's limits: {conc, delay (ms), jitter (its range, or false), block (ms), paused,
  -- floor (ms: robots.txt's Crawl-delay, which no jitter goes under; nil when none)}.
  local function limits(key)
    -- (PC.deflim: every key's limits, when nothing is set per key)
    local lim = PC.deflim or LIMITS[key]
    if lim then return lim end
    local def = PC.def or pol_defaults()
    if PC.deflim then return PC.deflim end
    local conc, delay, jitter = def[1], def[2], def[3]
    local block, paused = 0, false
    local slot = PC.slots and json_obj(redis.call('HGET', K_POLS, key), 'slot ' .. key)
    if slot then
      conc = pos_num(slot.concurrency, 1, 1e9) or conc
      delay = pos_num(slot.delay, 0, 1e9) or delay
      if type(slot.randomize_delay) == 'boolean' then
        jitter = slot.randomize_delay and (pos_num(slot.jitter, 0, 100) or 0.5)
        if jitter == 0 then jitter = false end
      end
    end
    local ov = PC.ovr and json_obj(redis.call('HGET', K_POLO, key), 'override ' .. key)
    -- delay: the override's delay wins outright, else the largest of the configured delay,
    -- robots.txt's crawl_delay and (AutoThrottle on) the state's "ad" or the start delay
    local auto = def[4]
    if auto then
      local ad = AUTO_DELAY[key]
      if ad == nil then ad = redis.call('HGET', K_POL .. key, 'ad') end  -- (state not read)
      ad = pos_num(tonumber(ad or ''), 0, 1e12)
      if ad then auto = ad / 1000 end
    end
    if auto and auto > delay then delay = auto end
    local floor
    if ov then
      local cd = pos_num(ov.crawl_delay, 0, 1e9)
      if cd and cd > delay then delay = cd end
      local od = pos_num(ov.delay, 0, 1e9)
      if od then delay = od elseif cd then floor = math.floor(cd * 1000 + 0.5) end
      conc = pos_num(ov.concurrency, 1, 1e9) or conc
      block = pos_num(ov.block_until, 0, 1e15) or 0
      paused = ov.paused == true
    end
    lim = {math.floor(conc), math.floor(delay * 1000 + 0.5), jitter, math.floor(block), paused,
      floor}
    LIMITS[key] = lim
    return lim
  end

  -- The tiers where a key has ready requests (so is a member of their open zsets), kept in
  -- its state as "tm", a bit per tier, so that a slot back rescores only those: written
  -- exactly by pol_push when the key enters a tier (from every tier's zset), cleared by
  -- pol_pop when a tier's queue of the key runs dry. Absent (never written, or the state
  -- expired and was written again by a grant): nil, meaning every tier, as before.
  local function tier_mask(v)
    local m = fnum(v)
    if m and m >= 0 and m < 2 ^ NTIERS then return m end
    return nil
  end
  local function in_tier(mask, t) return not mask or math.floor(mask / 2 ^ t) % 2 == 1 end

  -- In flight, next allowed grant (ms: the later of its delay's next start and its
  -- adaptive block, see pol_fail), since when it has had ready work without a grant, and
  -- the tiers whose open zset holds it (tier_mask): one HMGET of the fields needed. (With
  -- AutoThrottle on, also notes the key's delay, field "ad", for limits().) With now_ok, a
  -- key that opens_now gets 0 as its next allowed grant (neither read).
  -- Whether the key's next allowed grant cannot be later than now, whatever its state's
  -- "next" and "block" say, so that they need not be read: it has no delay (nor jitter or
  -- start window then: a grant sets its next to now), no override block or pause, and no
  -- key of the crawl is blocked past now (an adaptive block is always in the blocked zset
  -- too, pol_fail; one ZCOUNT per call); AutoThrottle off (its delay is in the state).
  local function opens_now(key)
    local lim = PC.deflim  -- (set only while AutoThrottle is off)
    if not lim then
      if (PC.def or pol_defaults())[4] then return false end
      lim = limits(key)
    end
    if lim[2] ~= 0 or lim[4] > NOW or lim[5] then return false end
    if PC.noblock == nil then
      -- (most crawls have no key blocked at all: the zset does not exist)
      if PC.polb_none == nil then PC.polb_none = redis.call('EXISTS', K_POLB) == 0 end
      PC.noblock = PC.polb_none or
        redis.call('ZCOUNT', K_POLB, '(' .. PC.now_s, '+inf') == 0
    end
    return PC.noblock
  end

  local function pol_state(key, now_ok)
    local v
    if now_ok and opens_now(key) then
      -- (next and block are at most now: not read)
      v = redis.call('HMGET', K_POL .. key, 'in', 'rdy', 'tm')
      local inn = fnum(v[1]) or 0
      if inn < 0 then inn = 0 end
      return inn, 0, fnum(v[2]) or 0, tier_mask(v[3])
    end
    if not PC.deflim and (PC.def or pol_defaults())[4] then
      v = redis.call('HMGET', K_POL .. key, 'in', 'next', 'block', 'rdy', 'tm', 'ad')
      AUTO_DELAY[key] = v[6] or false
    else
      v = redis.call('HMGET', K_POL .. key, 'in', 'next', 'block', 'rdy', 'tm')
    end
    local inn, nxt, block = fnum(v[1]) or 0, fnum(v[2]) or 0, fnum(v[3]) or 0
    if inn < 0 then inn = 0 end
    if block > nxt then nxt = block end
    return inn, nxt, fnum(v[4]) or 0, tier_mask(v[5])
  end

  -- When the key may next be granted, given its limits and state.
  local function opens_at(key, inn, nxt)
    local lim = limits(key)
    if lim[5] then return NOW + PAUSE_RECHECK end
    if inn >= lim[1] then return OPEN_FULL end
    if nxt > lim[4] then return nxt end  -- (no math.max: a C call costs a few hundred Ir)
    return lim[4]
  end

  -- The key's score in every tier's open zset where it is (it is there iff it has ready
  -- requests in that tier; mask: those tiers, nil if unknown).
  local function pol_rescore(key, score, mask)
    local s = score_s(score)
    for t = 0, NTIERS - 1 do
      if in_tier(mask, t) then redis.call('ZADD', open_key(t), 'XX', s, key) end
    end
  end

  -- An idle key (nothing in flight and, as far as its tier mask tells, no ready request):
  -- its state (only its next allowed time matters then) expires IDLE_TTL after that time; a
  -- grant makes it persist again. A key with ready requests keeps its state (as long as
  -- its queues exist), so a slot back between two grants does not set an expiry the next
  -- grant removes again.
  local function pol_idle_check(key, inn, nxt, mask)
    if inn > 0 or (mask and mask > 0) then return end
    local ttl = num_text(IDLE_TTL)
    if nxt > NOW then ttl = string.format('%d', nxt - NOW + IDLE_TTL) end
    redis.call('PEXPIRE', K_POL .. key, ttl)
  end

  -- k slots of each key given back (per_key: key -> k). Only a key that was full (in
  -- flight reached its concurrency: scored OPEN_FULL, or stale) is rescored; a key with a
  -- free slot before keeps its score (when it opened: max(next, block), set at its grant or
  -- push), and its state is read only to rescore it or to let it expire once idle (the
  -- fields needed, in one HMGET). (A key whose concurrency was raised, other than by an
  -- override, which rescores it itself, opens at its next slot back with nothing in flight.)
  -- The one tier whose open zset has keys, false if none has, -1 if several (read once
  -- per call, and again after pol_push adds a key to a tier: nothing else does).
  local function live_tier()
    if PC.live == nil then
      local live = false
      for t = 0, NTIERS - 1 do
        if redis.call('EXISTS', open_key(t)) == 1 then
          if live then live = -1; break end
          live = t
        end
      end
      PC.live = live
    end
    return PC.live
  end

  -- A slot back of a key that opens now (opens_now: its next allowed grant is at most
  -- now) that was full or has nothing in flight, done without reading its tier mask when
  -- at most one tier has keys with ready requests; true if done. (A key with ready
  -- requests is in its tiers' open zsets: with none, it has none; with one, it is in that
  -- one or in none, and a full key's score there, OPEN_FULL, changes iff it is a member.)
  local function back_now(key, inn, full)
    local lt = live_tier()
    if lt == false then
      pol_idle_check(key, inn, NOW, 0)
      return true
    end
    if lt < 0 or not full then return false end
    local score = opens_at(key, inn, NOW)
    if score >= OPEN_FULL then return false end
    if score < NOW then score = NOW end
    -- (a member has ready requests: its state keeps no expiry)
    return redis.call('ZADD', open_key(lt), 'XX', 'CH', score_s(score), key) == 1
  end

  local function pol_slots_back(per_key)
    for key, k in pairs(per_key) do
      local sk = K_POL .. key
      local inn = redis.call('HINCRBY', sk, 'in', num_text(-k))
      if inn < 0 then redis.call('HSET', sk, 'in', '0'); inn = 0 end
      local full = inn + k >= limits(key)[1]
      if (full or inn == 0) and not (opens_now(key) and back_now(key, inn, full)) then
        local nxt, mask
        if opens_now(key) then
          -- (its next allowed grant is at most now: only its tiers are read)
          nxt, mask = NOW, tier_mask(redis.call('HGET', sk, 'tm'))
        else
          local v = redis.call('HMGET', sk, 'next', 'block', 'tm')
          local block
          nxt, block, mask = fnum(v[1]) or 0, fnum(v[2]) or 0, tier_mask(v[3])
          if block > nxt then nxt = block end
        end
        if full then
          -- (a key whose slots were all taken opens now, not at its past next: its score is
          -- when it opened, for the politeness wait, and it queues behind keys open before)
          pol_rescore(key, math.max(opens_at(key, inn, nxt), NOW), mask)
        else
          -- only ever lowers a score (a stale OPEN_FULL); ZADD LT needs Redis 6.2
          local score = score_s(opens_at(key, inn, nxt))
          for t = 0, NTIERS - 1 do
            if in_tier(mask, t) then
              redis.call('ZADD', open_key(t), 'XX', 'LT', score, key)
            end
          end
        end
        pol_idle_check(key, inn, nxt, mask)
      end
    end
  end

  -- Slots given back: one per record still holding its slot (nil or keyless records, and
  -- records whose slot went back when their response arrived, are skipped).
  local function pol_release(recs)
    local per_key = {}
    -- (rec_slot's match, without its captures of the header's numbers, runs for every
    -- request acked unless the record starts with the same header and key as the one
    -- before it: the requests of one lease and key come together)
    local head, hlen, hkey
    for i = 1, table.maxn(recs) do
      local rec = recs[i]
      if rec and head and string.sub(rec, 1, hlen) == head then
        per_key[hkey] = per_key[hkey] + 1
      elseif rec then
        local _, e, m, n = string.find(rec, '^%-?%d+|%d+|[^|]*|([Kk])(%d+):')
        if m == 'K' then
          hlen = e + (PC.nums[n] or fnum(n) or tonumber(n))
          hkey = string.sub(rec, e + 1, hlen)
          head = string.sub(rec, 1, hlen)
          per_key[hkey] = (per_key[hkey] or 0) + 1
        end
      end
    end
    pol_slots_back(per_key)
  end

  -- ADAPTIVE BLOCKS (429/503; docs/politeness.md). The key's state hash keeps its backoff
  -- state as redcrawl.politeness.backoff.BackoffPolicy does ("fail" consecutive failures,
  -- "ok" successes since the last step of forgiveness) and its block ("block" until, ms;
  -- "bset" when it was set), mirrored in the blocked zset K_POLB for readers. The policy:
  -- control "backoff" (JSON base, cap (s), jitter, forgive_after; written by
  -- FrontierCore.store_politeness), else BackoffPolicy's defaults.
  local function backoff_policy()
    if PC.backoff then return PC.backoff end
    local b = json_obj(redis.call('HGET', K_CONTROL, 'backoff'), 'backoff') or {}
    PC.backoff = {
      base = pos_num(b.base, 0.001, 1e9) or 1.0,
      cap = pos_num(b.cap, 0.001, 1e9) or 300.0,
      jitter = pos_num(b.jitter, 0, 1) or 0.5,
      forgive = math.floor(pos_num(b.forgive_after, 1, 1e9) or 10),
    }
    return PC.backoff
  end

  local jitter_factor, pol_gap  -- (defined below, with the lease step)

  -- A 429/503 of a request of key, leased at since (ms; nil if unknown): one more failure
  -- and the key blocked for retry_ms (its Retry-After) or, without one, for the backoff
  -- delay of its failure count (BackoffPolicy.delay: min(cap, base * 2^(fail-1)), jitter
  -- taking up to its fraction off). A request leased before the key's current block was
  -- set failed in the same episode: it may lengthen the block (its own Retry-After) but
  -- is not counted again (several requests in flight when a site starts refusing are one
  -- failure, not several).
  local function pol_fail(key, retry_ms, since)
    local v = redis.call('HMGET', K_POL .. key, 'fail', 'block', 'bset')
    local fail, block, bset = math.max(num(v[1]), 0), num(v[2]), num(v[3])
    local episode = since and bset > 0 and since <= bset and block > NOW
    if not episode then fail = fail + 1 end
    local d = retry_ms
    if not d then
      local b = backoff_policy()
      local full = math.min(b.cap, b.base * 2 ^ math.min(math.max(fail - 1, 0), 60))
      d = math.floor(1000 * full * (1 - b.jitter + b.jitter * (jitter_factor() - 0.5)))
    end
    local fields = {'fail', fail, 'ok', 0}
    if NOW + d > block then
      block = NOW + d
      fields[5] = 'block'; fields[6] = block; fields[7] = 'bset'; fields[8] = NOW
    end
    redis.call('HSET', K_POL .. key, unpack(fields))
    redis.call('ZADD', K_POLB, block, key)
    -- (a key is blocked now: opens_now reads states again)
    PC.noblock, PC.polb_none = false, false
    local inn, nxt, _, mask = pol_state(key)
    pol_rescore(key, opens_at(key, inn, nxt), mask)
    pol_idle_check(key, inn, nxt, mask)
  end

  -- k more successes (responses that were not 429/503) of key: every forgive_after
  -- consecutive successes take one failure off its count (BackoffPolicy.succeeded).
  local function pol_succeed(key, k)
    local v = redis.call('HMGET', K_POL .. key, 'fail', 'ok')
    local fail, ok = num(v[1]), num(v[2]) + k
    if fail <= 0 then return end
    local f = backoff_policy().forgive
    while ok >= f and fail > 0 do fail = fail - 1; ok = ok - f end
    if fail == 0 then ok = 0 end
    redis.call('HSET', K_POL .. key, 'fail', fail, 'ok', ok)
  end

  -- Add n to a politeness counter of the stats hash (deferred_<reason>,
  -- politeness_wait_ms); a corrupt one starts again from n (these are event counters, not
  -- recoverable), rather than failing the script halfway.
  local function stat_add(field, n)
    -- (one HINCRBY, which refuses a corrupt value without writing: then it is replaced)
    local r = redis.pcall('HINCRBY', K_STATS, field, num_text(n))
    if type(r) == 'table' and r.err then
      redis.call('HSET', K_STATS, field, n)
      repaired('counter ' .. field .. ' held a non-integer; restarted from ' .. n)
    end
  end

  -- Ready count of a crawl with politeness (the per-key queues cannot be summed cheaply).
  local function pol_count(n)
    if n ~= 0 then redis.call('HINCRBY', K_STATS, 'ready', num_text(n)) end
  end

  -- READY for crawls with politeness: into each request's key queue; a key new to a
  -- tier's open zset gets its score.
  local function pol_push(items, front)
    local missing = {}
    for i, it in ipairs(items) do
      if not it[5] then missing[#missing + 1] = i end
    end
    if #missing > 0 then
      local ids = {}
      for j, i in ipairs(missing) do ids[j] = items[i][1] end
      local recs = hmget(K_REQ, ids)
      for j, i in ipairs(missing) do items[i][5] = recs[j] end
    end
    local groups, order = {}, {}
    for _, it in ipairs(items) do
      local key = (it[5] and rec_key(it[5])) or ''
      local t = tier_of(it[2])
      local g = t .. ':' .. key
      local list = groups[g]
      if not list then list = {t, key}; groups[g] = list; order[#order + 1] = g end
      if QORDER == 'priority' then
        list[#list + 1] = -it[2] * TWO32 + (front and 0 or (it[3] % TWO32))
      end
      list[#list + 1] = it[1]
    end
    local cmd = 'LPUSH'
    if QORDER == 'priority' then cmd = 'ZADD'
    elseif QORDER == 'fifo' and front then cmd = 'RPUSH' end
    for _, g in ipairs(order) do
      local list = groups[g]
      local t, key = list[1], list[2]
      bulk(cmd, pq_key(t, key), {unpack(list, 3)})
      if not redis.call('ZSCORE', open_key(t), key) then
        local inn, nxt = pol_state(key)
        local waiting = false
        local mask = 2 ^ t
        for u = 0, NTIERS - 1 do
          if u ~= t and redis.call('ZSCORE', open_key(u), key) then
            waiting = true
            mask = mask + 2 ^ u
          end
        end
        -- its tiers, exactly; and it has ready work from now on (for the politeness wait,
        -- see pol_pop)
        if waiting then redis.call('HSET', K_POL .. key, 'tm', num_text(mask))
        else redis.call('HSET', K_POL .. key, 'tm', num_text(mask), 'rdy', PC.now_s) end
        -- (a key with ready requests keeps its state: an idle one's expiry ends here, not
        -- at its grants, see pol_pop)
        redis.call('PERSIST', K_POL .. key)
        redis.call('ZADD', open_key(t), score_s(opens_at(key, inn, nxt)), key)
        PC.live = nil  -- (a tier may have keys now: live_tier reads again)
      end
    end
    pol_count(#items)
  end


  -- RESPONSE TIME (crawls with politeness; lib.lua's optional hooks). A request's slot of
  -- its key goes back when its response (or download error) reaches the worker, not at its
  -- ack: parsing and storing its children no longer count against the site. The request
  -- stays IN-FLIGHT under its lease; its record's slot mark turns from "K" to "k", so that
  -- its ack, nack, release or expiry does not give the slot back a second time.
  do
    slot_free = function(items)
      local ids = {}
      for i, it in ipairs(items) do ids[i] = it[1] end
      local recs = hmget(K_REQ, ids)
      local writes, per_key, ok, failed, seen = {}, {}, {}, {}, {}
      local freed = 0
      for i, it in ipairs(items) do
        local rec = recs[i]
        local p, _, t, pos
        if rec then p, _, t, pos = parse_head(rec) end
        if p ~= nil and not seen[it[1]] and FMT.held(it[1], t, it[2]) and
            string.byte(rec, pos) == 75 then  -- 'K': its slot is still held
          local key = rec_key(rec)
          if key then
            seen[it[1]] = true
            writes[#writes + 1] = it[1]
            writes[#writes + 1] =
              string.sub(rec, 1, pos - 1) .. 'k' .. string.sub(rec, pos + 1)
            per_key[key] = (per_key[key] or 0) + 1
            freed = freed + 1
            local outcome = it[3]
            if outcome == 's' then ok[key] = (ok[key] or 0) + 1
            elseif string.sub(outcome, 1, 1) == 'f' then
              failed[#failed + 1] = {key, tonumber(string.sub(outcome, 2)), lease_since(it[2])}
            end
          end
        end
      end
      if #writes > 0 then bulk('HSET', K_REQ, writes) end
      pol_slots_back(per_key)
      for key, k in pairs(ok) do pol_succeed(key, k) end
      for _, f in ipairs(failed) do pol_fail(f[1], f[2], f[3]) end
      return freed
    end

    defer_held = function(max_deferrals, items)
      local flags = {}
      for i, it in ipairs(items) do
        local id, token, reason, retry_ms = it[1], it[2], it[3], it[4]
        local rec = redis.call('HGET', K_REQ, id)
        local p, a, t, env
        if rec then p, a, t, env = parse(rec) end
        flags[i] = '0'
        if p ~= nil and FMT.held(id, t, token) then
          local key = rec_key(rec)
          local since = lease_since(token)
          a = FMT.cur(a)  -- (see FMT in lib.lua)
          if a > 0 then a = a - 1 end  -- no attempt spent
          local nrec = FMT.left(p, a, token, slot_held_env(env))
          redis.call('HSET', K_REQ, id, nrec)
          unhold({token}, {rec})  -- (its slot back, unless it went back at response time)
          if key then pol_fail(key, retry_ms, since) end
          stat_add('deferred_' .. reason, 1)
          -- (read, then written: a corrupt count is read as 0 rather than failing HINCRBY)
          local count = num(redis.call('HGET', K_DEFERS, id)) + 1
          redis.call('HSET', K_DEFERS, id, count)
          if count > max_deferrals then
            kill({id}, {'deferred ' .. count .. ' times (' .. reason .. '), more than ' ..
              'REDCRAWL_MAX_DEFERRALS (' .. max_deferrals .. ')'})
            flags[i] = 'd'
          else
            ready_push({{id, p, 0, nil, nrec}}, true)
            flags[i] = 'q'
          end
        elseif rec and p == nil and token ~= '' and holds(token, id) then
          kill({id}, {CORRUPT})
          unhold({token})
          flags[i] = 'd'
        end
      end
      return table.concat(flags)
    end
  end

  -- The start window (ms; control "start_window", written by Scrapy workers from
  -- REDCRAWL_POLITENESS_START_WINDOW; 0 if absent): a worker starts a granted request
  -- within it or gives it back, so consecutive grants of a key with a delay are spaced by
  -- the delay plus the window, and two starts at its site are at least the delay apart
  -- (docs/politeness.md, "Delay").
  local function start_window()
    if not PC.window then
      local v = redis.call('HGET', K_CONTROL, 'start_window')
      PC.window = (int_ok(v) and v) and math.max(math.min(num(v), 60000), 0) or 0
    end
    return PC.window
  end

  -- A small deterministic generator for the delay jitter (no math.random in scripts: Redis
  -- 6.2 seeds it the same in every call), seeded from the clock and the lease counter.
  -- jitter_factor(j): a factor in [1 - j, 1 + j), at least 0 (Scrapy 2.19's
  -- DOWNLOAD_DELAY_JITTER); jitter_factor(): one in [0.5, 1.5).
  jitter_factor = function(j)
    if not PC.seed then
      PC.seed = (NOW + 7919 * num(redis.call('HGET', K_STATS, 'leases'))) % 2147483647
      if PC.seed <= 0 then PC.seed = 12345 end
    end
    PC.seed = (PC.seed * 16807) % 2147483647
    local u = PC.seed / 2147483647
    if j then return math.max(0, 1 + j * (2 * u - 1)) end
    return 0.5 + u  -- [0.5, 1.5), as Scrapy's RANDOMIZE_DOWNLOAD_DELAY
  end

  -- The gap (ms) a start of a key with these limits charges before the key's next: its
  -- delay, times the jitter's factor (RANDOMIZE_DOWNLOAD_DELAY, as Scrapy's), never under
  -- the site's Crawl-delay (the jitter is Scrapy's for the crawl's own delay; a site's
  -- Crawl-delay is what it asked for), plus the start window when there is a gap at all.
  pol_gap = function(lim)
    local gap = lim[2]
    if lim[3] and gap > 0 then
      gap = math.floor(gap * jitter_factor(lim[3]))
      if lim[6] and gap < lim[6] then gap = lim[6] end
    end
    if gap > 0 then gap = gap + start_window() end
    return gap
  end

  -- For a batch of grants of one key in tier t: how many schedule positions from cursor
  -- the weighted-fair schedule (sched: its tier digits, as numbers) takes to pick t again,
  -- skipping tiers with no open key (as pol_pop does); nil if it would pick another tier
  -- first (one whose head is unknown, nil in heads, counts as open).
  local function next_pick(t, heads, cursor, sched)
    local slots = #sched
    for j = 0, slots - 1 do
      local c = sched[(cursor + j) % slots + 1]
      if c == t then return j + 1 end
      if heads[c] ~= false then return nil end
    end
    return nil
  end

  -- Whether t is the only tier with an open key (every other tier's head is known to be
  -- none: false in heads).
  local function alone(t, heads)
    for u = 0, NTIERS - 1 do
      if u ~= t and heads[u] ~= false then return false end
    end
    return true
  end

  -- The cursor after r more picks of tier t from cursor, when no other tier has an open key
  -- (as r steps of next_pick, each to just past the next place of t in the schedule): the
  -- places of t in the schedule (0-based) are listed once per call (sched.at[t]).
  local function after_picks(t, cursor, r, sched)
    local at = sched.at[t]
    if not at then
      at = {}
      for i = 1, #sched do
        if sched[i] == t then at[#at + 1] = i - 1 end
      end
      sched.at[t] = at
    end
    local slots, cnt = #sched, #at
    local o = cursor % slots
    local i = cnt + 1  -- (the first place of t at or after o; cnt + 1: the next cycle's first)
    for j = 1, cnt do
      if at[j] >= o then i = j; break end
    end
    local idx = i + r - 1
    local cycle = math.floor((idx - 1) / cnt)
    return cursor - o + cycle * slots + at[(idx - 1) % cnt + 1] + 1
  end

  -- The next open key of tier t (scored at most now) and its score (text), or false: the
  -- tier's open zset is read a few keys at a time, in its order (bufs[t]: the keys read and
  -- the position reached; as many keys as want more grants take at the default
  -- concurrency, and one more), and read again from its start when they are used up (the
  -- keys served since are out of the open range, or back in it: then the caller drops
  -- bufs[t]).
  local function open_head(t, bufs, want)
    local b = bufs[t]
    if not b or (b.i > #b.r and b.more) then
      local m = math.min(math.ceil(want / (PC.def or pol_defaults())[1]), 63) + 1
      local r = redis.call('ZRANGE', open_key(t), '-inf', PC.now_s, 'BYSCORE', 'LIMIT', '0',
        num_text(m), 'WITHSCORES')
      b = {r = r, i = 1, more = #r >= 2 * m}
      bufs[t] = b
    end
    local i = b.i
    if i > #b.r then return false end
    b.i = i + 2
    return b.r[i], b.r[i + 1]
  end

  -- Up to n ids whose keys are open now, for crawls with politeness: the tier by the
  -- weighted-fair schedule among tiers with an open key, then the key that opened first in
  -- it. Each grant takes a slot of its key (in + 1) and charges its delay (next). Returns
  -- the ids and their keys.
  local function pol_pop(n, schedule)
    local ids, keys, tiers = {}, {}, {}
    local slots = #schedule
    local cursor = num(redis.call('HGET', K_CONTROL, 'cursor'))
    local cursor0 = cursor
    local guard = 2 * n + 64  -- a key found closed is rescored once, then skipped
    -- the schedule's hex digits as numbers (read once, not a string.sub per pick)
    local sched = {string.byte(schedule, 1, slots)}
    for i = 1, slots do
      local b = sched[i]
      if b >= 97 then sched[i] = b - 87 elseif b >= 65 then sched[i] = b - 55
      else sched[i] = b - 48 end
    end
    sched.at = {}
    -- the open key of each tier (false: none open now) and its score (text), the next one
    -- taken once it is served (only its own tier's zset changes; in the others it stays
    -- the head)
    local heads, opened, bufs = {}, {}, {}
    local lt = PC.live
    if lt ~= nil and lt ~= -1 then
      -- (the tiers without keys are known already, live_tier: not read)
      for t = 0, NTIERS - 1 do
        if t ~= lt then heads[t] = false end
      end
    end
    local waited = 0
    while #ids < n and guard > 0 do
      guard = guard - 1
      local any = false
      for t = 0, NTIERS - 1 do
        if heads[t] == nil then heads[t], opened[t] = open_head(t, bufs, n - #ids) end
        if heads[t] then any = true end
      end
      if not any then break end
      local t = 0
      if QORDER ~= 'priority' then
        for _ = 1, slots do
          local c = sched[cursor % slots + 1]
          cursor = cursor + 1
          if heads[c] then t = c; break end
        end
      end
      local key = heads[t]
      heads[t] = nil
      local sk = K_POL .. key
      local inn, nxt, rdy, mask = pol_state(key, true)
      local score = opens_at(key, inn, nxt)
      if score > NOW then
        -- its override or state changed since it was scored: put it where it belongs
        redis.call('ZADD', open_key(t), score_s(score), key)
      else
        local q = pq_key(t, key)
        local len
        if QORDER == 'priority' then len = redis.call('ZCARD', q)
        else len = redis.call('LLEN', q) end
        if len == 0 then
          redis.call('ZREM', open_key(t), key)
          if mask and in_tier(mask, t) then
            redis.call('HSET', sk, 'tm', num_text(mask - 2 ^ t))
          end
        else
          local lim = limits(key)
          local gap = pol_gap(lim)
          -- how many of the key to grant now: one; with no delay, as many as its free slots,
          -- its queue and the lease allow, while the tier schedule keeps picking this tier
          -- (one state read and write and one rescore per key, not per request)
          local k = 1
          if gap == 0 then
            local room = lim[1] - inn
            if n - #ids < room then room = n - #ids end
            if len < room then room = len end
            if QORDER == 'priority' then k = math.max(room, 1)
            elseif room > 1 and alone(t, heads) then
              -- (no other tier has an open key: the schedule picks t at each of its next
              -- room - 1 places, and the cursor moves past the last of them)
              k = room
              cursor = after_picks(t, cursor, room - 1, sched)
            else
              while k < room do
                local step = next_pick(t, heads, cursor, sched)
                if not step then break end
                cursor = cursor + step
                k = k + 1
              end
            end
          end
          local got
          if QORDER == 'priority' then
            local p = redis.call('ZPOPMIN', q, num_text(k))
            got = {}
            for i = 1, #p, 2 do got[#got + 1] = p[i] end
          elseif QORDER == 'fifo' then got = redis.call('RPOP', q, num_text(k))
          else got = redis.call('LPOP', q, num_text(k)) end
          local m = #ids
          for i = 1, #got do m = m + 1; ids[m] = got[i]; keys[m] = key; tiers[m] = t end
          -- the politeness wait of this grant: from when the key had work waiting (its
          -- previous grant, or work arriving at a key without any) to when its limits let
          -- it open (its score: the time it opened; later than that, it waited for a
          -- worker, not for politeness)
          local op = fnum(opened[t]) or 0
          if rdy > 0 and op > rdy then waited = waited + (op - rdy) end
          local emptied = #got >= len
          local nxt_s = PC.now_s
          if gap ~= 0 then nxt_s = string.format('%.17g', NOW + gap) end
          if emptied and mask and in_tier(mask, t) then
            redis.call('HSET', sk, 'in', num_text(inn + #got), 'next', nxt_s, 'rdy', PC.now_s,
              'tm', num_text(mask - 2 ^ t))
          else
            redis.call('HSET', sk, 'in', num_text(inn + #got), 'next', nxt_s, 'rdy', PC.now_s)
          end
          -- (a key granted with nothing in flight may carry an expiry even with ready
          -- work: the robots.txt charge, a fleet AutoThrottle update, a worker before the
          -- fifth pass set one; its state must live while a request is in flight)
          if inn == 0 then redis.call('PERSIST', sk) end
          inn, nxt = inn + #got, NOW + gap
          if emptied then
            redis.call('ZREM', open_key(t), key)
          else
            -- a grant only raises the key's score: in the other tiers a stale (lower) score
            -- is corrected when it comes up (above), so only this tier is rescored now
            score = opens_at(key, inn, nxt)
            redis.call('ZADD', open_key(t), 'XX', score_s(score), key)
            -- (open again now: its place among the open keys read is unknown, so the tier
            -- is read again)
            if score <= NOW then bufs[t] = nil end
          end
        end
      end
    end
    if QORDER ~= 'priority' and cursor ~= cursor0 then
      redis.call('HSET', K_CONTROL, 'cursor', num_text(cursor % (slots * 1000000)))
    end
    pol_count(-#ids)
    if waited > 0 then stat_add('politeness_wait_ms', waited) end
    return ids, keys, tiers
  end

  -- Up to n ids whose keys are open now (pol_pop), after the blocks that have ended left
  -- the blocked zset (their "block" field stays, in the past). Returns ids, their keys and
  -- their tiers (aligned lists).
  local function pol_grant(n, schedule)
    -- (an empty blocked zset does not exist: nothing to remove, no key blocked)
    if PC.polb_none == nil then PC.polb_none = redis.call('EXISTS', K_POLB) == 0 end
    if PC.polb_none then PC.noblock = true
    else redis.call('ZREMRANGEBYSCORE', K_POLB, '-inf', PC.now_s) end
    return pol_pop(n, schedule)
  end

  -- Granted but not leased after all (a missing or corrupt record): their slots back, one
  -- per key in the list.
  local function pol_unpop(keys)
    if #keys == 0 then return end
    local fake = {}
    for i, k in ipairs(keys) do fake[i] = '0|0||K' .. #k .. ':' .. k end
    pol_release(fake)
  end

  -- The ready count of a crawl with politeness is a counter (stats "ready"); a corrupt one
  -- is recounted from the key queues before anything is written (every key with ready
  -- requests is in its tier's open zset).
  if not int_ok(redis.call('HGET', K_STATS, 'ready')) then
    local n = 0
    for t = 0, NTIERS - 1 do
      for _, key in ipairs(redis.call('ZRANGE', open_key(t), 0, -1)) do
        if QORDER == 'priority' then n = n + redis.call('ZCARD', pq_key(t, key))
        else n = n + redis.call('LLEN', pq_key(t, key)) end
      end
    end
    redis.call('HSET', K_STATS, 'ready', n)
    repaired('counter ready held a non-integer; recounted: ' .. n)
  end
  return K_POL, K_POLO, open_key, pq_key, limits, pol_state, opens_at, pol_rescore,
    pol_idle_check, pol_release, pol_push, pol_grant, pol_unpop, pol_gap, pol_fail
  end)()
end
