-- disown.lua: a live worker's leases that it does not hold, taken back now (to READY, or
-- DEAD once max_attempts deliveries are used up; politeness slots freed), as expired
-- leases of a dead worker would be. Such an orphan lease comes from an ack undone by a
-- failover to a lagging replica, or a lease reply that never reached the worker; its
-- worker's heartbeat would keep it in flight forever (docs/cluster.md, "Durability").
-- The worker must send this call when no other call of its own is on its way (e.g. from
-- its one I/O thread, between calls): every lease granted to it has then been answered,
-- so one it does not name is one it will never ack.
-- KEYS, ARGV[1..4]: see lib.lua.
-- ARGV[5] worker id   ARGV[6] max_attempts   ARGV[7] lease ttl (ms; streams layer)
-- ARGV[8..]: the lease tokens the worker holds.
-- Returns the number of requests taken back (also counted in stats "orphaned").
local held = {}
for i = 8, #ARGV do held[ARGV[i]] = true end
-- (a corrupt counter is restarted before anything is written: HINCRBY would fail after)
if not int_ok(redis.call('HGET', K_STATS, 'orphaned')) then
  redis.call('HSET', K_STATS, 'orphaned', 0)
end
local n = expire_worker(ARGV[5], held, tonumber(ARGV[6]), tonumber(ARGV[7]))
if n > 0 then redis.call('HINCRBY', K_STATS, 'orphaned', n) end
return n
