-- lib.lua: shared prelude of every frontier script of both backends. A script is, in this
-- order (redcrawl.frontier.core.script_files): lua/base.lua, this file, the dedupe prelude
-- (redcrawl/dedupe/lua), the backend's queue layer queue_<backend>.lua (the contract it
-- fulfils is the QUEUE LAYER block below), ops.lua, then the script itself.
--
-- Request ids: a request with a fingerprint is identified by it (20 raw bytes), so "is it
-- queued?" is "is it a field of req?"; a request without one (dont_filter) gets
-- "#<seq>" (never 20 bytes long).
--
-- A request's record carries its state header: "<priority>|<attempts>|<token>|<envelope>".
-- <token> is empty unless the request is IN-FLIGHT; then it names the lease (one lease
-- per lease() call, a crawl-wide counter, never reused). Keeping this in the record makes
-- every per-request step an O(1) access to one big hash; the per-lease structures
-- (inflight, leases, left) have one entry per lease() call, not per request. A lists
-- crawl without politeness created since FMT (below) keeps the lease state out of the
-- record instead: a lease writes no record, <attempts> counts the deliveries that ended
-- and <token> is a fence (see THE LEASE STATE OF A RECORD).
--
-- KEYS (one fixed layout for every script, built by redcrawl.keys.CrawlKeys.script_keys):
--   1 req       HASH  id -> record (above), for every request not DONE
--   2 inflight  ZSET  token -> lease deadline (ms)
--   3 leases    HASH  token -> msgpack [since_ms, worker, id, id, ...]
--   4 left      HASH  token -> how many of the lease's requests are still held
--   5 delayed   ZSET  id -> due time (ms)
--   6 dead      ZSET  id -> time of death (ms)
--   7 err       HASH  id -> last error
--   8 stats     HASH  seq, leases, inflight, accepted, filtered, done, retried, reclaimed,
--                     died, requeued, orphaned (disown.lua)
--   9 workers   HASH  worker -> heartbeat deadline (ms)
--  10 control   HASH  paused ("1"), cursor (weighted-fair position), layout and layout.copy
--                     (ordering, tier bounds and dedupe the crawl was created with)
--  11 fpd       dedupe: key base of the DONE fingerprints' filter (see redcrawl/dedupe/lua;
--                the filter's own keys are named after it, in the same hash tag)
--  12 calls     HASH  "<worker>#<slot>" -> nonce .. msgpack [push flags, ack flags, id,
--                token, ...] (or [push flags, ack flags, token]: a lease whose entry in
--                leases lists the ids, see call_record): a worker's last state-changing
--                calls ("#~<n>": calls without a worker), replayed if the same call comes
--                again (a retry after a lost reply; see call_replay in ops.lua)
--  13..         the ready-queue layer's keys. lists: the ready queue of each tier, highest
--                first (LIST for fifo/lifo, ZSET for priority). streams: the streams of each
--                shard, high then low (see queue_streams.lua); KEYS 2-4 are unused there.
-- ARGV (common to every script):
--   1 ordering  "fifo" | "lifo" | "priority" (lists); "streams/<shards>" (streams)
--   2 bounds    comma-separated lowest priority of each tier but the last, e.g. "1,0"
--   3 dedupe    the dedupe spec (redcrawl.dedupe.DedupeSpec.encode), read by the prelude
--   4 now_ms    "" to use the server clock (TIME), else the caller's clock in ms
-- Script-specific ARGV start at 5.

local K_REQ, K_INFLIGHT, K_LEASES, K_LEFT = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_DELAYED, K_DEAD, K_ERR, K_STATS = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_WORKERS, K_CONTROL, K_FPD, K_CALLS = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local FIRST_TIER = 13
-- A lists crawl with politeness has the layout "<ordering>/<key mode>" ("fifo/host"), a
-- streams crawl "streams/<shards>/<key mode>": POLITE is then the key mode, and the
-- politeness keys come after the queue layer's (see polite.lua); nil otherwise.
local ORDERING, POLITE = ARGV[1], nil
if string.find(ARGV[1], '/', 1, true) then  -- ("fifo", "lifo", "priority": no match to try)
  local o, m = string.match(ARGV[1], '^(%l+)/(%l+)$')
  if o and o ~= 'streams' then ORDERING, POLITE = o, m end
  -- a streams crawl with politeness: "streams/<shards>/<key mode>"
  local so, sm = string.match(ARGV[1], '^(streams/%d+)/(%l+)$')
  if so then ORDERING, POLITE = so, sm end
end

-- (the default bounds as a literal, others parsed with plain finds: ~10k instructions per
-- call otherwise; a crawl with strict priority has one tier and reads no bound)
local BOUNDS = {}
if ARGV[2] == '1,0' then BOUNDS = {1, 0}
elseif ORDERING ~= 'priority' then
  local s, at, n = ARGV[2], 1, 0
  while at <= #s do
    local comma = string.find(s, ',', at, true) or (#s + 1)
    n = n + 1
    BOUNDS[n] = tonumber(string.sub(s, at, comma - 1))
    at = comma + 1
  end
end
local NTIERS = (ORDERING == 'priority') and 1 or (#BOUNDS + 1)
-- A crawl with politeness ends its KEYS with the politeness keys (see polite.lua): the
-- open zset of each tier, then six more.
local POL_NKEYS = POLITE and (NTIERS + 6) or 0

-- Numbers read from the crawl's state. A stored counter or time that is not a decimal
-- integer Redis's HINCRBY and Lua's arithmetic both accept is corrupt: int_ok tells, num
-- reads one as 0 (a heartbeat or cursor), and the prelude below repairs the counters
-- before any script writes, so that no script fails halfway through a change (Redis does
-- not roll a script back).
local function int_ok(v)
  return not v or (#v <= 18 and string.match(v, '^-?%d+$') ~= nil)
end
local function num(v)
  if v and #v <= 18 and string.match(v, '^-?%d+$') then return tonumber(v) end
  return 0
end

-- What the prelude repaired, for repair.lua's reply (and the server log).
local REPAIRED = {}
local function repaired(what)
  REPAIRED[#REPAIRED + 1] = what
  redis.log(redis.LOG_WARNING, 'redcrawl: repaired ' .. K_STATS .. ': ' .. what)
end

local DD = ARGV[3]
-- FMT: the record format of this crawl (one table: the scripts have few spare locals).
--   stamps  records carry their push time
--   lout    attempts and lease token live outside the record (see FMT.lout below)
local FMT = {stamps = true, lout = false}
local NOW
-- Whether the crawl is paused (control "paused", read with the layout; op_lease).
local PAUSED
do
  -- Every key must hold its own type (or not exist): a key overwritten with another type
  -- would make a command fail halfway through a script, after earlier writes (Redis does
  -- not roll a script back). Checked before anything is written; the crawl is then
  -- refused with an error naming the key. (The queue keys only up to 16 of them: a
  -- streams crawl with more shards would pay a TYPE per stream on every call.) The
  -- control and stats hashes are not asked their TYPE: they are read below before
  -- anything is written, and a read of a key of another type fails (redis.pcall) with
  -- the same refusal. (A TYPE is ~5k instructions, the loop around it ~1k.)
  local function damaged(i, expect, t)
    t = t or redis.call('TYPE', KEYS[i])['ok']
    return redis.error_reply('crawl state damaged: key ' .. KEYS[i] .. ' holds a ' .. t ..
      ', not a ' .. expect .. '; nothing was changed. Restore the key from a backup, ' ..
      'or purge the crawl')
  end
  local want = {'hash', 'zset', 'hash', 'hash', 'zset', 'zset', 'hash', false, 'hash', false,
                false, 'hash'}
  local queue = 'list'
  if ORDERING == 'priority' then queue = 'zset'
  elseif string.sub(ORDERING, 1, 8) == 'streams/' then queue = 'stream' end
  local nkeys = #KEYS
  local last_queue = nkeys
  if POLITE then
    -- the queue layer's keys, the open zset of each tier, two key bases (not keys), two
    -- hashes, a zset and a hash
    last_queue = nkeys - POL_NKEYS
    for i = last_queue + 1, last_queue + NTIERS do want[i] = 'zset' end
    -- (after the open zsets: the queue base and the state base, which are not keys)
    want[last_queue + NTIERS + 3] = 'hash'  -- overrides
    want[last_queue + NTIERS + 4] = 'hash'  -- DOWNLOAD_SLOTS
    want[last_queue + NTIERS + 5] = 'zset'  -- blocked keys
    want[last_queue + NTIERS + 6] = 'hash'  -- deferral counts
  end
  -- (and the politeness keys after many streams)
  local upto, from = math.min(nkeys, FIRST_TIER + 15), math.max(last_queue + 1, FIRST_TIER + 16)
  local i = 0
  while true do
    i = i + 1
    if i > upto and i < from then i = from end
    if i > nkeys then break end
    local expect = want[i]
    if expect == nil and i >= FIRST_TIER and i <= last_queue then expect = queue end
    if expect then
      local t = redis.call('TYPE', KEYS[i])['ok']
      if t ~= 'none' and t ~= expect then return damaged(i, expect, t) end
    end
  end
  local stored = redis.pcall('HMGET', K_CONTROL, 'layout', 'layout.copy', 'paused')
  if stored.err then return damaged(10, 'hash') end
  local counters = {'seq', 'leases', 'inflight', 'accepted', 'filtered', 'done', 'retried',
                    'reclaimed', 'died', 'requeued'}
  local vals = redis.pcall('HMGET', K_STATS, unpack(counters))
  if vals.err then return damaged(8, 'hash') end
  PAUSED = stored[3] == '1'

  -- The layout a crawl was created with must not change under it: workers with another
  -- ordering, other tiers or another dedupe would read the queues or the filter wrongly.
  -- It is kept twice (layout, layout.copy), so that a corrupted value is restored from
  -- the other; only when neither is readable is the crawl refused with an error naming
  -- both.
  local layout = ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. DD
  local created, copy = stored[1], stored[2]
  if created ~= copy then
    local function layout_ok(v)
      return v and string.match(v, '^%l[%l/%d]* [-%d,]* %l+[ %w.+-]*$') ~= nil
    end
    if layout_ok(created) and not layout_ok(copy) then
      redis.call('HSET', K_CONTROL, 'layout.copy', created)
      if copy then repaired('control layout.copy restored from layout') end
    elseif layout_ok(copy) and not layout_ok(created) then
      redis.call('HSET', K_CONTROL, 'layout', copy)
      repaired('control layout restored from layout.copy')
      created = copy
    else
      return redis.error_reply('crawl layout unreadable: ' .. K_CONTROL .. ' holds layout "' ..
        tostring(created) .. '" and layout.copy "' .. tostring(copy) .. '"; if you know the ' ..
        'settings the crawl was created with, HSET both fields to the layout "' .. layout ..
        '" of a worker with those settings, or purge the crawl')
    end
  end
  -- A crawl created since records carry their push time (latency.lua) says so in its
  -- layout (STAMPED): a worker older than that would read a stamped record as an
  -- undecodable request, and is refused by this very check instead (its layout lacks the
  -- mark). A crawl created before keeps its layout and gets no stamps, so older workers
  -- can share it. Likewise a lists crawl created since a lease leaves the records alone
  -- (FMT.lout below; with politeness too since session 24) is marked " +leasestate"
  -- (before " +pushtime"): a worker older than that would read its records' headers
  -- wrongly (it takes the token field for the holder's token), and is refused by the same
  -- check; crawls created before keep the record format they were created with, and their
  -- workers (old and new) share it. A polite lists crawl in that format is marked
  -- " +slotmark" too (before " +leasestate"): workers before it accepted " +leasestate"
  -- on any lists crawl but kept a polite crawl's lease state in its records (they would
  -- never give a site's slot back); the extra mark makes them refuse it.
  local lout_mark = POLITE and ' +slotmark +leasestate' or ' +leasestate'
  if not created then
    FMT.lout = string.sub(ORDERING, 1, 8) ~= 'streams/'
    local mark = layout .. (FMT.lout and lout_mark or '') .. ' +pushtime'
    redis.call('HSET', K_CONTROL, 'layout', mark, 'layout.copy', mark)
  elseif created == layout .. lout_mark .. ' +pushtime' then
    FMT.lout = true  -- (the usual cases first, compared whole)
  elseif created ~= layout .. ' +pushtime' then
    local rest = created
    if string.sub(rest, -10) == ' +pushtime' then rest = string.sub(rest, 1, -11)
    else FMT.stamps = false end
    if string.sub(rest, -#lout_mark) == lout_mark then
      rest = string.sub(rest, 1, -#lout_mark - 1); FMT.lout = true
    end
    if rest ~= layout then
      -- (the same settings, with a mark of a newer redcrawl this worker does not know:
      -- upgrading it is the answer, not a setting)
      if string.sub(rest, 1, #layout + 2) == layout .. ' +' then
        return redis.error_reply('crawl layout mismatch: the crawl was created with "' ..
          created .. '" and this worker uses "' .. layout .. '": the same settings, by a ' ..
          'newer redcrawl (the mark "' .. string.sub(rest, #layout + 2) .. '" is unknown ' ..
          'here); upgrade this worker to the redcrawl version of the others')
      end
      return redis.error_reply('crawl layout mismatch: the crawl was created with ' ..
        'backend/ordering, tier bounds and dedupe "' .. created .. '" and this worker uses "' ..
        layout .. '"; give every worker the same REDCRAWL_BACKEND, REDCRAWL_SHARDS, ' ..
        'REDCRAWL_ORDERING (SCHEDULER_QUEUE_CLASS), REDCRAWL_TIER_BOUNDS, ' ..
        'REDCRAWL_DEDUPE, REDCRAWL_DEDUPE_CAPACITY, REDCRAWL_DEDUPE_ERROR_RATE and ' ..
        'REDCRAWL_RECRAWL_AFTER, REDCRAWL_POLITENESS and REDCRAWL_POLITENESS_KEY (lists: ' ..
        '"<ordering>/<key mode>" is a crawl with fleet-wide politeness), or purge the crawl')
    end
  end

  if ARGV[4] ~= '' then NOW = tonumber(ARGV[4]) else NOW = server_ms() end

  -- The state machine's counters, checked by every script before its first write and
  -- repaired when corrupt: accepted and done from each other (accepted - done is the
  -- number of stored records, HLEN req), inflight from the leases' counts (left), the id
  -- and token counters past any value they can have handed out (the server's clock in
  -- milliseconds), the event counters (not recoverable) from zero. (All of them checked
  -- by one match first: a match per counter cost ~2k instructions each.)
  local all = {}
  for i = 1, 10 do
    local v = vals[i]
    if v and #v > 18 then all = nil; break end
    all[i] = v or '0'
  end
  if not (all and string.match(table.concat(all, ','),
      '^%-?%d+,%-?%d+,%-?%d+,%-?%d+,%-?%d+,%-?%d+,%-?%d+,%-?%d+,%-?%d+,%-?%d+$')) then
    local bad, fix = {}, {}
    for i, name in ipairs(counters) do
      if not int_ok(vals[i]) then bad[name] = true end
    end
    local n_stored = redis.call('HLEN', K_REQ)
    for _, name in ipairs(counters) do
      if bad[name] then
        local v = 0
        if name == 'seq' or name == 'leases' then
          -- (milliseconds: Lua prints numbers past 10^14 as "1e+14")
          local t = redis.call('TIME')
          v = t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000))
          if name == 'leases' then
            -- lease tokens are never below the clock in microseconds (lease_ready): past
            -- every token of this millisecond too, by the server's clock and the caller's
            v = string.format('%.0f', (math.max(tonumber(v), math.floor(NOW)) + 1) * 1000)
          end
        elseif name == 'inflight' then
          for _, n in ipairs(redis.call('HVALS', K_LEFT)) do v = v + math.max(num(n), 0) end
        elseif name == 'accepted' then
          v = (bad.done and 0 or num(vals[6])) + n_stored
        elseif name == 'done' and not bad.accepted then
          v = math.max(num(vals[4]) - n_stored, 0)
        end
        fix[#fix + 1] = name; fix[#fix + 1] = v
        repaired('counter ' .. name .. ' held a non-integer; set to ' .. v)
      end
    end
    if #fix > 0 then redis.call('HSET', K_STATS, unpack(fix)) end
  end
end

-- HMGET in chunks; returns a list aligned with ids (a new table).
local function hmget(key, ids)
  local n = #ids
  if n == 0 then return {} end
  if n <= CHUNK then return redis.call('HMGET', key, unpack(ids)) end
  local out, k = {}, 0
  for i = 1, n, CHUNK do
    local part = redis.call('HMGET', key, unpack(ids, i, math.min(i + CHUNK - 1, n)))
    for x = 1, #part do out[k + x] = part[x] end
    k = k + #part
  end
  return out
end

local function is_fingerprint(id) return #id == 20 end

-- priority, attempts, token of a record and the position its envelope starts at; nil for
-- a record without a readable header (corrupt: it is dead-lettered wherever it is met;
-- its numbers must have at most 15 digits, as redcrawl.frontier.lists.parse_record reads).
-- (the numbers read through NUM_TEXT, below: a call meets few distinct priorities and
-- attempt counts, and tonumber's strtod costs ~1.4k instructions, more than the match)
local NUM_TEXT = {}
local function parse_head(rec)
  local p, a, t, pos = string.match(rec, '^(-?%d+)|(%d+)|([^|]*)|()')
  -- numbers beyond 2^53 would come back as "1e+20", which no parser reads
  if not p or #p > 15 or #a > 15 then return nil end
  local pn, an = NUM_TEXT[p], NUM_TEXT[a]
  if not pn then pn = tonumber(p); NUM_TEXT[p] = pn end
  if not an then an = tonumber(a); NUM_TEXT[a] = an end
  return pn, an, t, pos
end

-- The token field of a record, or nil as for parse_head (positions captured, not texts:
-- ~600 instructions less than parse_head, for the ack of every request).
local function head_token(rec)
  local p2, a1, a2, t = string.match(rec, '^%-?%d+()|()%d+()|([^|]*)|')
  if not p2 or p2 > 16 or a2 - a1 > 15 then return nil end
  return t
end

-- priority, attempts, token, envelope of a record (nil as for parse_head).
local function parse(rec)
  local p, a, t, pos = parse_head(rec)
  if not p then return nil end
  return p, a, t, string.sub(rec, pos)
end

local CORRUPT = "stored record has no state header"

-- The politeness key stored in a record ("K<length>:<key>" in front of the envelope; see
-- redcrawl.frontier.records), or nil if it has none; and whether the request's slot of
-- that key is still held ("K"), or was given back when its response arrived ("k": see
-- slot_free in polite.lua). A grant (stamp_leased) makes it "K" again.
local function rec_slot(rec)
  -- (one match for the header and the mark: this runs for every request acked)
  local p, a, m, n, at = string.match(rec, '^(-?%d+)|(%d+)|[^|]*|([Kk])(%d+):()')
  if not p or #p > 15 or #a > 15 then return nil end
  return string.sub(rec, at, at + tonumber(n) - 1), m == 'K'
end
local function rec_key(rec)
  return (rec_slot(rec))
end

-- An envelope part (after the state header) with its slot mark back to "K" (held).
local function slot_held_env(env)
  if string.byte(env, 1) == 107 then return 'K' .. string.sub(env, 2) end  -- 'k'
  return env
end

-- A number as text, remembered for the rest of the call: Lua formats a number with
-- sprintf("%.14g") (~0.7 us each), and a call writes the same few priorities and attempt
-- counts into many headers. (NUM_TEXT also maps decimal texts to their numbers, for
-- parse_head: a number and a string are different keys.)
local function num_text(v)
  local s = NUM_TEXT[v]
  if not s then s = tostring(v); NUM_TEXT[v] = s end
  return s
end

local function header(p, a, t, env)
  return num_text(p) .. '|' .. num_text(a) .. '|' .. t .. '|' .. env
end

-- THE LEASE STATE OF A RECORD, in one of two formats (FMT.lout, chosen when the crawl is
-- created, kept in its layout):
--   in the record (FMT.lout false: crawls created before, and crawls on streams): the
--     header's attempts count the deliveries so far, the one in progress included, and its
--     token names the lease holding the request ("" when it is not IN-FLIGHT); a lease
--     rewrites every record it leases, an ack reads the token back.
--   out of it (FMT.lout true: lists crawls): a lease writes no record (with politeness the
--     slot mark at rest is "K", the response's slot_free writes "k", FMT.left "K" again).
--     The header's attempts count the deliveries that ended (expired or nacked; a release
--     gives its delivery back), not the one in progress; its token field is a fence: no
--     lease whose token is <= it holds the request (lease tokens only grow). A request is
--     IN-FLIGHT under lease L iff L's entry in leases lists it and its fence is below L.
--     Every way out of a lease but the ack (nack, release, expiry, disown, deferral)
--     rewrites the record with the fence L (a stale ack under L is then refused); an ack
--     deletes the record, and a push writes the crawl's last lease token as the fence of
--     a new fingerprint record where one acked under a lease still live may come back
--     (recrawl, or a DONE filter that forgets: RECRAWL_AFTER), so that no older lease
--     holds it; elsewhere a DONE fingerprint is never accepted again.
-- FMT.cur(a)            the attempt number of the delivery in progress (record attempts a)
-- FMT.holds(t, token)   whether a record whose token field is t may be held under token
--                       (lout: besides being listed by its entry, see FMT.held)
-- FMT.held(id, t, token)
--                       whether the request id, its record's token field t, is IN-FLIGHT
--                       under token (the lease entries read are kept for the call in
--                       FMT.sets; the queue layer forgets one it deletes)
-- FMT.left(p, a, token, env)
--                       the record of a request leaving lease token, a attempts spent
-- FMT.member(token)     (queue layer, lout) the set of ids the lease's entry lists, or nil
function FMT.cur(a)
  if FMT.lout then return a + 1 end
  return a
end
function FMT.holds(t, token)
  if not FMT.lout then return t ~= '' and t == token end
  -- (tokens and fences are counters in decimal, compared as such without tonumber,
  -- whose strtod costs more than the rest of an ack's check)
  return t == '' or #t < #token or (#t == #token and t < token)
end
FMT.sets = {}  -- lease entries read in this call, by token (false: none)
function FMT.held(id, t, token)
  if not FMT.lout then return t ~= '' and t == token end
  -- (FMT.holds, inline: this runs for every request acked)
  if not (t == '' or #t < #token or (#t == #token and t < token)) then return false end
  local set = FMT.sets[token]
  if set == nil then set = FMT.member(token) or false; FMT.sets[token] = set end
  return set and set[id] == true
end
function FMT.left(p, a, token, env)
  -- (lout with politeness: a record out of flight holds its slot mark "K" again, so that
  -- its next lease, which writes no record, takes a slot)
  if FMT.lout then return header(p, a, token, POLITE and slot_held_env(env) or env) end
  return header(p, a, '', env)
end

local function tier_of(priority)
  if ORDERING == 'priority' then return 0 end
  local n = #BOUNDS
  for i = 1, n do
    if priority >= BOUNDS[i] then return i - 1 end
  end
  return n
end

-- QUEUE LAYER. The backend's queue layer (queue_lists.lua, queue_streams.lua) keeps READY
-- and IN-FLIGHT requests; everything else (records, dedupe, DELAYED, DEAD, counters,
-- heartbeats, pause, call replay) is this file's and ops.lua's. These names are declared
-- here and defined by the queue layer, each of them (ops.lua refuses to run otherwise);
-- nothing else of a queue layer is used outside it.
--
--   PUSH_STRIDE  number of ARGV fields per pushed request: (record, fingerprint, priority)
--                and the layer's own after them (lists 3; streams 4: the shard);
--                ops.lua adds 2 (the dedupe's member and bucket, last)
--   ready_push(items, front)
--                put {id, priority, seq, shard, record} items into READY (shard: nil if
--                unknown; record: nil unless the caller has it). front: requests coming
--                back (from IN-FLIGHT, DELAYED or DEAD), served next where the layer can
--   ready_push_new(m, ids, prios, seqs, p)
--                optional (nil where the layer has none, e.g. with politeness): op_push's
--                m accepted requests into READY, as aligned lists of ids and priorities
--                (prios nil: all of priority p; seqs: their push sequence numbers, for
--                strict priority only); the same
--                as ready_push(items, false) without a table per request (~1.6k
--                instructions each)
--   unhold(tokens, recs)
--                the requests of these tokens (one per request) left IN-FLIGHT: end their
--                holds (the caller has rewritten their records already); recs: their
--                records, aligned with tokens (nil, or nil entries, where unknown: a
--                politeness slot is then not given back)
--   holds(token, id) -> boolean
--                whether the lease token covers id, whose record is corrupt (so its own
--                token is unreadable): a worker giving it back sends it to DEAD
--   lease_expired(worker, n, ttl, max_attempts, limit) -> got
--                a lease's reclaim step: expired leases (at most limit) of dead workers
--                back to READY or DEAD; up to n of their requests may be handed to worker
--                at once (lists: none). got is a lease reply: a flat list of id, attempts,
--                record, token for each request leased
--   lease_ready(worker, n, ttl, schedule, got)
--                READY -> IN-FLIGHT for up to n requests, appended to the lease reply got
--                (stamp_leased below does the records); schedule: the weighted-fair tier
--                schedule (lists; unused by streams)
--   reclaim_expired(limit, max_attempts, ttl) -> number taken back
--                maintain's reclaim step: expired leases of dead workers back to READY or
--                DEAD, without leasing
--   expire_worker(worker, held, max_attempts, ttl) -> number of requests
--                held nil: make all of the worker's leases expire now (its heartbeat is
--                gone), returns how many requests they hold. held a set of lease tokens:
--                the live worker's leases not in it (it does not hold them: disown.lua)
--                back to READY or DEAD now, slots freed; returns how many were taken back
-- ops.lua builds op_lease from these (promote, lease_expired, heartbeat, lease_ready).
local PUSH_STRIDE
local ready_push, ready_push_new, unhold, holds, lease_expired, lease_ready, reclaim_expired, expire_worker
-- Optional hooks (lists crawls with fleet-wide politeness; nil otherwise):
--   slot_free(items) -> number of slots given back
--                items: {id, token, outcome} of IN-FLIGHT requests whose response (or
--                download error) arrived: each gives its key's slot back now, once; the
--                request stays IN-FLIGHT under its lease. outcome: "s" a response
--                (success: forgives backoff), "e" a download error, "f<ms>" a 429/503
--                not deferred (blocks the key: <ms> its Retry-After, "" for backoff)
--   defer_held(max_deferrals, items) -> flags
--                items: {id, token, reason, retry_ms}: IN-FLIGHT -> READY (front of its
--                key's queue, no attempt spent) and the key blocked; past max_deferrals
--                -> DEAD. One flag per item: "q" deferred, "d" dead, "0" stale
local slot_free, defer_held

-- A worker's last calls are kept in this many slots of K_CALLS (redcrawl.keys.CALL_SLOTS).
local CALL_SLOTS = 16

-- Forget a worker's last calls (it is gone).
local function calls_forget(worker)
  local fields = {}
  for i = 0, CALL_SLOTS - 1 do fields[#fields + 1] = worker .. '#' .. i end
  redis.call('HDEL', K_CALLS, unpack(fields))
end

-- The deferral counts (KEYS after the politeness keys; nil without politeness): an
-- entry per request deferred and not yet DONE or DEAD.
local K_DEFERS

-- Forget the deferral counts of these ids (they are DONE or DEAD).
local function defers_forget(ids)
  if K_DEFERS and #ids > 0 and redis.call('EXISTS', K_DEFERS) == 1 then
    bulk('HDEL', K_DEFERS, ids)
  end
end

-- To DEAD with a reason each: ids and whys are aligned lists.
local function kill(ids, whys)
  if #ids == 0 then return end
  defers_forget(ids)
  local z, e = {}, {}
  for i, id in ipairs(ids) do
    z[#z + 1] = NOW; z[#z + 1] = id
    e[#e + 1] = id; e[#e + 1] = whys[i]
  end
  bulk('ZADD', K_DEAD, z)
  bulk('HSET', K_ERR, e)
  redis.call('HINCRBY', K_STATS, 'died', #ids)
end

-- Back to READY (front of its tier). With reset, attempts start again from zero.
local function requeue(ids, reset)
  if #ids == 0 then return end
  local recs = hmget(K_REQ, ids)
  local items, writes, corrupt, whys = {}, {}, {}, {}
  for i, id in ipairs(ids) do
    local rec = recs[i]
    if rec then
      local p, a, t, pos = parse_head(rec)
      if p == nil then
        corrupt[#corrupt + 1] = id; whys[#whys + 1] = CORRUPT
      elseif FMT.lout and not reset then
        items[#items + 1] = {id, p, 0, nil, rec}  -- (its fence stays: FMT)
      else
        if reset then a = 0 end
        local nrec = header(p, a, FMT.lout and t or '', string.sub(rec, pos))
        writes[#writes + 1] = id; writes[#writes + 1] = nrec
        items[#items + 1] = {id, p, 0, nil, nrec}
      end
    end
  end
  if #writes > 0 then bulk('HSET', K_REQ, writes) end
  ready_push(items, true)
  kill(corrupt, whys)
end

-- DELAYED -> READY for every request due by now (at most limit).
local function promote_due(limit)
  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', NOW, 'LIMIT', 0, limit)
  if #due == 0 then return 0 end
  bulk('ZREM', K_DELAYED, due)
  requeue(due, false)
  return #due
end


-- Why a request whose lease expired attempts times goes to DEAD.
local function expired_why(attempts, worker)
  return 'lease expired ' .. attempts .. ' times (last worker: ' .. tostring(worker) .. ')'
end

-- READY -> IN-FLIGHT for the records of ids (for lease_ready): attempts + 1 and the lease
-- token written into each header (FMT.lout: nothing written, the reply says them): token
-- (a string) for all of them, or token(i) for the i-th (a function, called only for a
-- request leased). A corrupt record goes to DEAD; a
-- missing one (and, with fresh, one already carrying a token: its request is elsewhere) is
-- skipped. Appends id, attempts, record, token to the lease reply got for each request
-- leased; returns a list aligned with ids: its attempts, or false if it was not leased.
local function stamp_leased(ids, token, fresh, got)
  local one = type(token) == 'string' and token
  local recs = hmget(K_REQ, ids)
  local writes, corrupt, whys, out = {}, {}, {}, {}
  local g, w, lout = #got, 0, FMT.lout
  for i = 1, #ids do
    local id, rec = ids[i], recs[i]
    local p, a, t, pos
    if rec then p, a, t, pos = parse_head(rec) end
    out[i] = false
    if rec and p == nil then
      corrupt[#corrupt + 1] = id; whys[#whys + 1] = CORRUPT
    elseif rec and not (fresh and t ~= '') then
      local tk = one or token(i)
      a = a + 1
      if not lout then  -- (lout: the record stays as it is, see FMT)
        local env = string.sub(rec, pos)
        if POLITE then env = slot_held_env(env) end  -- a grant takes a slot
        rec = header(p, a, tk, env)
        writes[w + 1] = id; writes[w + 2] = rec; w = w + 2
      elseif POLITE and string.byte(rec, pos) == 107 then
        -- (lout: a record out of flight is "K", FMT.left; a "k" one, from elsewhere, is
        -- made "K", or its ack would not give back the slot this grant took)
        rec = string.sub(rec, 1, pos - 1) .. 'K' .. string.sub(rec, pos + 1)
        writes[w + 1] = id; writes[w + 2] = rec; w = w + 2
      end
      got[g + 1] = id; got[g + 2] = a; got[g + 3] = rec; got[g + 4] = tk; g = g + 4
      out[i] = a
    end
  end
  kill(corrupt, whys)
  if w > 0 then bulk('HSET', K_REQ, writes) end
  return out
end
