-- nack.lua: a failed request goes IN-FLIGHT -> DELAYED (retry after a delay) or -> DEAD.
-- KEYS, ARGV[1..4]: see lib.lua.
-- ARGV[5] max_attempts   ARGV[6] worker id   ARGV[7] call nonce (see call_replay in ops.lua)
-- ARGV[8..]: quads (id, token, error text, delay ms; "-1" = dead now).
-- A request whose deliveries reached max_attempts goes to DEAD whatever the delay.
-- Returns one character per request: "r" retried, "d" dead, "0" stale (not held).
local max_attempts, worker, nonce = tonumber(ARGV[5]), ARGV[6], ARGV[7]
local replay = call_replay(worker, nonce)
if replay then return replay[1] end
local flags = {}
for i = 8, #ARGV, 4 do
  local id, token, why, delay = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
  local rec = redis.call('HGET', K_REQ, id)
  local p, a, t, env
  if rec then p, a, t, env = parse(rec) end
  if p ~= nil and FMT.held(id, t, token) then
    a = FMT.cur(a)  -- (the delivery in progress spent: see FMT in lib.lua)
    redis.call('HSET', K_REQ, id, FMT.left(p, a, token, env))
    unhold({token}, {rec})
    if delay < 0 or a >= max_attempts then
      kill({id}, {why})
      flags[#flags + 1] = 'd'
    else
      redis.call('HSET', K_ERR, id, why)
      redis.call('ZADD', K_DELAYED, NOW + delay, id)
      redis.call('HINCRBY', K_STATS, 'retried', 1)
      flags[#flags + 1] = 'r'
    end
  elseif rec and p == nil and kill_corrupt_held(id, token) then
    flags[#flags + 1] = 'd'
  else
    flags[#flags + 1] = '0'
  end
end
flags = table.concat(flags)
call_record(worker, nonce, flags, '', {})
return flags
