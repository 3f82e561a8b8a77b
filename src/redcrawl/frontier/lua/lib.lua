-- lib.lua: shared prelude of every frontier script (prepended by frontier/lists.py).
--
-- KEYS (one fixed layout for every script, built by redcrawl.keys.CrawlKeys.script_keys):
--   1 req       HASH  id -> "<priority>|<envelope msgpack>" for every request not DONE
--   2 att       HASH  id -> deliveries so far
--   3 owner     HASH  id -> "<token>|<since_ms>|<worker>" while IN-FLIGHT
--   4 inflight  ZSET  id -> lease deadline (ms)
--   5 delayed   ZSET  id -> due time (ms)
--   6 dead      ZSET  id -> time of death (ms)
--   7 err       HASH  id -> last error
--   8 stats     HASH  seq, accepted, filtered, done, retried, reclaimed, died, requeued
--   9 workers   HASH  worker -> heartbeat deadline (ms)
--  10 control   HASH  paused ("1"), cursor (weighted-fair position)
--  11 fpq       dedupe: fingerprints queued (accepted, not done)
--  12 fpd       dedupe: fingerprints done
--  13..         ready queue of each tier, highest first (LIST for fifo/lifo, ZSET for priority)
-- ARGV (common to every script):
--   1 ordering  "fifo" | "lifo" | "priority"
--   2 bounds    comma-separated lowest priority of each tier but the last, e.g. "1,0"
--   3 now_ms    "" to use the server clock (TIME), else the caller's clock in ms
-- Script-specific ARGV start at 4.

local K_REQ, K_ATT, K_OWNER, K_INFLIGHT = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_DELAYED, K_DEAD, K_ERR, K_STATS = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_WORKERS, K_CONTROL, K_FPQ, K_FPD = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local FIRST_TIER = 13
local ORDERING = ARGV[1]

local BOUNDS = {}
for b in string.gmatch(ARGV[2], '[^,]+') do BOUNDS[#BOUNDS + 1] = tonumber(b) end

local NOW
if ARGV[3] ~= '' then
  NOW = tonumber(ARGV[3])
else
  local t = redis.call('TIME')
  NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local TWO32 = 4294967296

-- Tier index (0-based) of a priority.
local function tier_of(priority)
  if ORDERING == 'priority' then return 0 end
  for i, b in ipairs(BOUNDS) do
    if priority >= b then return i - 1 end
  end
  return #BOUNDS
end

local function ready_key(tier) return KEYS[FIRST_TIER + tier] end

-- Put id into its ready queue. front=true: it is served next within its tier
-- (used for requests coming back from IN-FLIGHT, DELAYED or DEAD).
local function ready_push(id, priority, front)
  local key = ready_key(tier_of(priority))
  if ORDERING == 'priority' then
    -- Strict priority, FIFO among equal priorities by id.
    redis.call('ZADD', key, -priority * TWO32 + (tonumber(id) % TWO32), id)
  elseif ORDERING == 'fifo' then
    if front then redis.call('RPUSH', key, id) else redis.call('LPUSH', key, id) end
  else -- lifo
    redis.call('LPUSH', key, id)
  end
end

-- Priority of a stored request, from its record header (0 if unreadable).
local function stored_priority(id)
  local rec = redis.call('HGET', K_REQ, id)
  return rec and tonumber(string.match(rec, '^(-?%d+)|')) or 0
end

local function requeue(id)
  ready_push(id, stored_priority(id), true)
end

local function kill(id, why)
  redis.call('ZADD', K_DEAD, NOW, id)
  redis.call('HSET', K_ERR, id, why)
  redis.call('HINCRBY', K_STATS, 'died', 1)
end

-- DELAYED -> READY for every request due by now (at most limit).
local function promote_due(limit)
  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', NOW, 'LIMIT', 0, limit)
  for _, id in ipairs(due) do
    redis.call('ZREM', K_DELAYED, id)
    requeue(id)
  end
  return #due
end

-- IN-FLIGHT leases past their deadline: extended if the owner's heartbeat is still
-- alive, else back to READY (or DEAD once max_attempts deliveries are used up).
local function reclaim_expired(limit, max_attempts)
  local ids = redis.call('ZRANGEBYSCORE', K_INFLIGHT, '-inf', NOW, 'LIMIT', 0, limit)
  local n = 0
  for _, id in ipairs(ids) do
    local rec = redis.call('HGET', K_OWNER, id)
    local worker = rec and string.match(rec, '^[^|]*|[^|]*|(.*)$')
    local hb = worker and tonumber(redis.call('HGET', K_WORKERS, worker) or '0') or 0
    if hb > NOW then
      redis.call('ZADD', K_INFLIGHT, hb, id)
    else
      redis.call('ZREM', K_INFLIGHT, id)
      redis.call('HDEL', K_OWNER, id)
      local att = tonumber(redis.call('HGET', K_ATT, id) or '0')
      if att >= max_attempts then
        kill(id, 'lease expired ' .. att .. ' times (last worker: ' .. tostring(worker) .. ')')
      else
        requeue(id)
        redis.call('HINCRBY', K_STATS, 'reclaimed', 1)
      end
      n = n + 1
    end
  end
  return n
end

-- The owner record of an IN-FLIGHT id if its token matches, else nil.
local function owned(id, token)
  local rec = redis.call('HGET', K_OWNER, id)
  if rec and string.match(rec, '^([^|]*)|') == token then return rec end
  return nil
end

local function release(id)
  redis.call('ZREM', K_INFLIGHT, id)
  redis.call('HDEL', K_OWNER, id)
end
