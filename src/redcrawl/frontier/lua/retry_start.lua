-- retry_start.lua: a request a worker holds is to be fetched again by Scrapy's
-- RetryMiddleware (a 500, a timeout): it keeps its lease and its key's slot (a retried
-- download never reaches the hooks that give the slot back), but its start was never
-- spaced: without this step the retry reaches the site milliseconds after the failure
-- (docs/politeness.md, "Scrapy's retries"). Uses polite.lua's limits, opens_at, pol_gap
-- and pol_rescore.
-- KEYS, ARGV[1..4]: see lib.lua.
-- ARGV[5..]: pairs (id, token) of requests held under those leases.
-- For each held one, a start is reserved at its key's site: the latest of now, the key's
-- "next" (its next grant, a delay after the last one), its last charged start plus the
-- delay ("chg") and its blocks (429/503, the operator's block_until); then "chg" = that
-- start and "next" = it plus the key's gap (pol_gap, as at a grant), the key's score
-- raised to match, so that no grant of the key comes within its delay of the retry.
-- A request whose key an operator paused gets no start (the worker gives it back: served
-- again once the key is resumed).
-- Returns one wait per pair, in ms from now, as a list of integers: -1 for a request not
-- held under that token (or no politeness: every one -1), -2 for one whose key is paused,
-- else >= 0.
local n = (#ARGV - 4) / 2
local waits = {}
for i = 1, n do waits[i] = -1 end
if not POLITE then return waits end
for i = 1, n do
  local id, token = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
  local rec = redis.call('HGET', K_REQ, id)
  local p, _, t
  if rec then p, _, t = parse_head(rec) end
  if p ~= nil and FMT.held(id, t, token) then
    local key = rec_key(rec)
    if key then
      local lim = limits(key)
      if lim[5] then
        waits[i] = -2
      else
        local v = redis.call('HMGET', K_POL .. key, 'in', 'next', 'chg', 'block')
        local inn, nxt, chg, blk = math.max(num(v[1]), 0), num(v[2]), num(v[3]), num(v[4])
        local start = math.max(NOW, nxt, blk, lim[4])
        if lim[2] > 0 then start = math.max(start, chg + lim[2]) end
        nxt = math.max(nxt, start + pol_gap(lim))
        redis.call('HSET', K_POL .. key, 'chg', start, 'next', nxt)
        pol_rescore(key, opens_at(key, inn, math.max(nxt, blk)))
        waits[i] = start - NOW
      end
    else
      waits[i] = 0
    end
  end
end
return waits
