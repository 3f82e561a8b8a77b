-- lib.lua: shared prelude of every frontier script (prepended by frontier/lists.py).
--
-- Request ids: a request with a fingerprint is identified by it (20 raw bytes), so "is it
-- queued?" is "is it a field of req?"; a request without one (dont_filter) gets
-- "#<seq>" (never 20 bytes long).
--
-- KEYS (one fixed layout for every script, built by redcrawl.keys.CrawlKeys.script_keys):
--   1 req       HASH  id -> "<priority>|<envelope msgpack>" for every request not DONE
--   2 att       HASH  id -> deliveries so far
--   3 owner     HASH  id -> "<token>|<since_ms>|<worker>" while IN-FLIGHT (token: unique
--                     per lease in the crawl)
--   4 inflight  ZSET  id -> lease deadline (ms)
--   5 delayed   ZSET  id -> due time (ms)
--   6 dead      ZSET  id -> time of death (ms)
--   7 err       HASH  id -> last error
--   8 stats     HASH  seq, leases, accepted, filtered, done, retried, reclaimed, died,
--                     requeued
--   9 workers   HASH  worker -> heartbeat deadline (ms)
--  10 control   HASH  paused ("1"), cursor (weighted-fair position)
--  11 fpd       dedupe: fingerprints of DONE requests (see dedupe_*.lua)
--  12..         ready queue of each tier, highest first (LIST for fifo/lifo, ZSET for priority)
-- ARGV (common to every script):
--   1 ordering  "fifo" | "lifo" | "priority"
--   2 bounds    comma-separated lowest priority of each tier but the last, e.g. "1,0"
--   3 now_ms    "" to use the server clock (TIME), else the caller's clock in ms
-- Script-specific ARGV start at 4.

local K_REQ, K_ATT, K_OWNER, K_INFLIGHT = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_DELAYED, K_DEAD, K_ERR, K_STATS = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_WORKERS, K_CONTROL, K_FPD = KEYS[9], KEYS[10], KEYS[11]
local FIRST_TIER = 12
local ORDERING = ARGV[1]

local BOUNDS = {}
for b in string.gmatch(ARGV[2], '[^,]+') do BOUNDS[#BOUNDS + 1] = tonumber(b) end
local NTIERS = (ORDERING == 'priority') and 1 or (#BOUNDS + 1)

local NOW
if ARGV[3] ~= '' then
  NOW = tonumber(ARGV[3])
else
  local t = redis.call('TIME')
  NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local TWO32 = 4294967296
local CHUNK = 2000

-- redis.call(cmd, key, args...) in chunks (Lua's unpack has a stack limit).
local function bulk(cmd, key, args)
  for i = 1, #args, CHUNK do
    redis.call(cmd, key, unpack(args, i, math.min(i + CHUNK - 1, #args)))
  end
end

-- HMGET in chunks; returns a list aligned with ids.
local function hmget(key, ids)
  local out = {}
  for i = 1, #ids, CHUNK do
    local part = redis.call('HMGET', key, unpack(ids, i, math.min(i + CHUNK - 1, #ids)))
    for _, v in ipairs(part) do out[#out + 1] = v end
  end
  return out
end

local function is_fingerprint(id) return #id == 20 end

local function tier_of(priority)
  if ORDERING == 'priority' then return 0 end
  for i, b in ipairs(BOUNDS) do
    if priority >= b then return i - 1 end
  end
  return #BOUNDS
end

local function ready_key(tier) return KEYS[FIRST_TIER + tier] end

-- Put ids into their ready queues. items: list of {id, priority, seq}. front=true: served
-- next within the tier (requests coming back from IN-FLIGHT, DELAYED or DEAD).
local function ready_push(items, front)
  local per_tier = {}
  for _, it in ipairs(items) do
    local t = tier_of(it[2])
    local list = per_tier[t]
    if not list then list = {}; per_tier[t] = list end
    if ORDERING == 'priority' then
      -- strict priority; FIFO among equal priorities by push sequence (front: seq 0)
      list[#list + 1] = -it[2] * TWO32 + (front and 0 or (it[3] % TWO32))
    end
    list[#list + 1] = it[1]
  end
  for t, list in pairs(per_tier) do
    local cmd = 'LPUSH'
    if ORDERING == 'priority' then cmd = 'ZADD'
    elseif ORDERING == 'fifo' and front then cmd = 'RPUSH' end
    bulk(cmd, ready_key(t), list)
  end
end

-- Priority of a stored record, from its header (0 if unreadable).
local function record_priority(rec)
  return rec and tonumber(string.match(rec, '^(-?%d+)|')) or 0
end

-- Back to READY (front of its tier) for ids whose record is stored.
local function requeue(ids)
  if #ids == 0 then return end
  local recs = hmget(K_REQ, ids)
  local items = {}
  for i, id in ipairs(ids) do items[i] = {id, record_priority(recs[i]), 0} end
  ready_push(items, true)
end

-- To DEAD with a reason each: ids and whys are aligned lists.
local function kill(ids, whys)
  if #ids == 0 then return end
  local z, e = {}, {}
  for i, id in ipairs(ids) do
    z[#z + 1] = NOW; z[#z + 1] = id
    e[#e + 1] = id; e[#e + 1] = whys[i]
  end
  bulk('ZADD', K_DEAD, z)
  bulk('HSET', K_ERR, e)
  redis.call('HINCRBY', K_STATS, 'died', #ids)
end

-- DELAYED -> READY for every request due by now (at most limit).
local function promote_due(limit)
  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', NOW, 'LIMIT', 0, limit)
  if #due == 0 then return 0 end
  bulk('ZREM', K_DELAYED, due)
  requeue(due)
  return #due
end

local function worker_of(rec) return rec and string.match(rec, '^[^|]*|[^|]*|(.*)$') end

-- IN-FLIGHT leases past their deadline: extended if the owner's heartbeat is still
-- alive, else back to READY (or DEAD once max_attempts deliveries are used up).
local function reclaim_expired(limit, max_attempts)
  local ids = redis.call('ZRANGEBYSCORE', K_INFLIGHT, '-inf', NOW, 'LIMIT', 0, limit)
  if #ids == 0 then return 0 end
  local recs = hmget(K_OWNER, ids)
  local hb = {}
  local extend, gone, gone_workers = {}, {}, {}
  for i, id in ipairs(ids) do
    local w = worker_of(recs[i])
    local alive = 0
    if w then
      if hb[w] == nil then hb[w] = tonumber(redis.call('HGET', K_WORKERS, w) or '0') end
      alive = hb[w]
    end
    if alive > NOW then
      extend[#extend + 1] = alive; extend[#extend + 1] = id
    else
      gone[#gone + 1] = id; gone_workers[#gone_workers + 1] = tostring(w)
    end
  end
  if #extend > 0 then bulk('ZADD', K_INFLIGHT, extend) end
  if #gone == 0 then return 0 end
  bulk('ZREM', K_INFLIGHT, gone)
  bulk('HDEL', K_OWNER, gone)
  local atts = hmget(K_ATT, gone)
  local back, dead, whys = {}, {}, {}
  for i, id in ipairs(gone) do
    local att = tonumber(atts[i] or '0')
    if att >= max_attempts then
      dead[#dead + 1] = id
      whys[#whys + 1] = 'lease expired ' .. att .. ' times (last worker: ' .. gone_workers[i] .. ')'
    else
      back[#back + 1] = id
    end
  end
  kill(dead, whys)
  requeue(back)
  if #back > 0 then redis.call('HINCRBY', K_STATS, 'reclaimed', #back) end
  return #gone
end

-- Of the (id, token) pairs, the ids whose lease is still held with that token.
local function owned(ids, tokens)
  local recs = hmget(K_OWNER, ids)
  local ok = {}
  for i, id in ipairs(ids) do
    local rec = recs[i]
    if rec and string.match(rec, '^([^|]*)|') == tokens[i] then ok[#ok + 1] = id end
  end
  return ok
end

local function release(ids)
  bulk('ZREM', K_INFLIGHT, ids)
  bulk('HDEL', K_OWNER, ids)
end
