-- charge.lua: fetch starts at a politeness key's site that its grants did not account for
-- (crawls with politeness, lists backend; docs/politeness.md, "Starts after a wait"). Uses
-- the queue layer's politeness helpers (limits, pol_state, opens_at, pol_rescore,
-- pol_idle_check, lease_since, pol_gap in polite.lua).
-- KEYS, ARGV[1..4]: see lib.lua.
-- ARGV[5..]: triples (kind, a, b):
--   "r", key, ""     the robots.txt of the key's site is being downloaded now: a fetch
--                    start at the site, charged.
--   "s", id, token   a granted request that waited in its worker (for robots.txt) past its
--                    start window asks to start now. It may iff its key has no delay, or
--                    no grant of the key came after its own (the state's "rdy", written at
--                    each grant, is not after the lease's time) and no start was charged
--                    within the key's delay before now (the state's "chg"): then its start
--                    is charged. Otherwise the worker gives it back (release), and the
--                    key's "next" is raised to the last charged start plus the delay
--                    (robots.txt's Crawl-delay may have come after that start's charge),
--                    its score with it. Refused too while the key is blocked (429/503,
--                    or an operator's block_until) or paused by an operator.
--   "b", key, ms     the key's site answered its robots.txt with a status that pushes back
--                    (429/503): the key is blocked for the fleet for ms (its Retry-After)
--                    or, with ms "", for the backoff of its failure count (pol_fail, as a
--                    deferral of one of its requests). Flag "1".
-- A charge: "chg" = now, "next" = max(next, now + the key's gap: pol_gap, as at a
-- grant), the key's score raised to match in every tier's open
-- zset; a key with nothing in flight gets its idle expiry (as pol_idle_check).
-- Returns one flag per triple: "1" charged (may start), "0" refused (give it back), "n"
-- not held under that token (not to be started: the fleet serves it again), "-" nothing
-- to do (a request without a politeness key, or no politeness: every flag "-").
local n = (#ARGV - 4) / 3
if not POLITE then return string.rep('-', n) end
local flags = {}
for i = 1, n do
  local kind, a, b = ARGV[2 + 3 * i], ARGV[3 + 3 * i], ARGV[4 + 3 * i]
  local key, since = nil, nil
  flags[i] = '-'
  if kind == 'b' then
    pol_fail(a, tonumber(b), nil)
    flags[i] = '1'
  elseif kind == 'r' then
    key = a
  elseif kind == 's' then
    local rec = redis.call('HGET', K_REQ, a)
    local p, _, t
    if rec then p, _, t = parse_head(rec) end
    if p ~= nil and FMT.held(a, t, b) then
      key = rec_key(rec)
      since = lease_since(b)
    else
      flags[i] = 'n'  -- no longer held (its lease taken back): not to be started here
    end
  end
  if key then
    local lim = limits(key)
    local delay = lim[2]
    local v = redis.call('HMGET', K_POL .. key, 'in', 'next', 'rdy', 'chg', 'block')
    local inn, nxt, rdy, chg = math.max(num(v[1]), 0), num(v[2]), num(v[3]), num(v[4])
    local ok = kind == 'r' or ((delay == 0 or
      (since ~= nil and rdy <= since and chg + delay <= NOW)) and num(v[5]) <= NOW
      and lim[4] <= NOW and not lim[5])
    if not ok then
      flags[i] = '0'
      -- (refused: the key waits a whole delay from the start charged last, which a charge
      -- made before robots.txt's Crawl-delay was known set only the shorter delay after)
      if chg + delay > nxt then
        nxt = chg + delay
        redis.call('HSET', K_POL .. key, 'next', nxt)
        local opens = math.max(nxt, num(v[5]))
        pol_rescore(key, opens_at(key, inn, opens))
      end
    else
      flags[i] = '1'
      local gap = pol_gap(lim)
      nxt = math.max(nxt, NOW + gap)
      redis.call('HSET', K_POL .. key, 'chg', NOW, 'next', nxt)
      local opens = math.max(nxt, num(v[5]))
      pol_rescore(key, opens_at(key, inn, opens))
      pol_idle_check(key, inn, opens)
    end
  end
end
return table.concat(flags)
