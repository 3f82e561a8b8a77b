-- retry_start.lua: a request a worker holds is to be fetched again by Scrapy's
-- RetryMiddleware (a 500, a timeout): it keeps its lease and its key's slot (a retried
-- download never reaches the hooks that give the slot back), but its start was never
-- spaced: without this step the retry reaches the site milliseconds after the failure
-- (docs/politeness.md, "Scrapy's retries"). Uses polite.lua's limits, opens_at, pol_gap
-- and pol_rescore.
-- KEYS, ARGV[1..4]: see lib.lua.
-- ARGV[5..]: triples (id, token, kind) of requests held under those leases; kind "r"
-- reserves a start, "c" checks one reserved before whose time has come.
-- "r": a start is reserved at the request's key's site: the latest of now, the key's
-- "next" (its next grant, a delay after the last one) and its last charged start plus the
-- delay ("chg"); then "chg" = that start and "next" = it plus the key's gap (pol_gap, as
-- at a grant), the key's score raised to match, so that no grant of the key comes within
-- its delay of the retry.
-- "c": nothing is written; the request may start now (0) unless its key was paused or
-- blocked while it waited.
-- A request whose key is paused by an operator or blocked (a 429/503's block, an
-- operator's block_until) gets no start and changes nothing: the worker gives it back, and
-- it is served when the key opens again (a block lifted early included), no attempt spent.
-- So does one whose slot already went back (its record's mark "k": its response arrived,
-- as for a retry made in a spider's callback; the worker pushes those as new requests).
-- Returns one wait per triple, in ms from now, as a list of integers: -1 for a request not
-- held under that token (or no politeness: every one -1), -2 for one to give back, else
-- >= 0.
local n = (#ARGV - 4) / 3
local waits = {}
for i = 1, n do waits[i] = -1 end
if not POLITE then return waits end
for i = 1, n do
  local id, token, kind = ARGV[2 + 3 * i], ARGV[3 + 3 * i], ARGV[4 + 3 * i]
  local rec = redis.call('HGET', K_REQ, id)
  local p, _, t, pos
  if rec then p, _, t, pos = parse_head(rec) end
  if p ~= nil and FMT.held(id, t, token) then
    local key = rec_key(rec)
    if key then
      local lim = limits(key)
      local v = redis.call('HMGET', K_POL .. key, 'in', 'next', 'chg', 'block')
      local inn, nxt, chg, blk = math.max(num(v[1]), 0), num(v[2]), num(v[3]), num(v[4])
      if lim[5] or blk > NOW or lim[4] > NOW or string.byte(rec, pos) ~= 75 then  -- 'K'
        waits[i] = -2
      elseif kind == 'c' then
        waits[i] = 0
      else
        local start = math.max(NOW, nxt)
        if lim[2] > 0 then start = math.max(start, chg + lim[2]) end
        nxt = math.max(nxt, start + pol_gap(lim))
        redis.call('HSET', K_POL .. key, 'chg', start, 'next', nxt)
        pol_rescore(key, opens_at(key, inn, nxt))
        waits[i] = start - NOW
      end
    else
      waits[i] = 0
    end
  end
end
return waits
