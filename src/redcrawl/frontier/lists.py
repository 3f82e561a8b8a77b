"""The lists backend: ready queues as Redis lists (or one sorted set for strict priority),
delays and leases as sorted sets, every transition one Lua script (``lua/*.lua``).

Layout of one crawl (see :class:`redcrawl.keys.CrawlKeys` and ``lua/lib.lua``): a request
is identified by its fingerprint (or ``#<seq>`` without one) and stored once, in one hash,
as ``<priority>|<attempts>|<lease token>|<msgpack envelope>``; the ready queues and the
delayed and dead sets hold ids. One ``lease()`` call is one lease: a token (a crawl-wide
counter) with a deadline in ``inflight``, the worker and ids in ``leases``, and the
requests it covers carrying that token in their record. Workers heartbeat into
``workers``; a lease past its deadline is extended while its worker's heartbeat is alive,
and its requests are reclaimed otherwise.
"""

from __future__ import annotations

import logging
import os
import re
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import redis
import redis.exceptions

from redcrawl import codec, dedupe, scripts
from redcrawl.codec import Envelope
from redcrawl.dedupe import DedupeSpec, Filter, Mode
from redcrawl.errors import DecodeError, FrontierError
from redcrawl.frontier.base import (
    Counts,
    DeadInfo,
    InflightInfo,
    Lease,
    PendingInfo,
    PushResult,
    RequestInfo,
    Settled,
    fair_schedule,
    format_id,
    parse_id,
)
from redcrawl.keys import CALL_SLOTS, CrawlKeys
from redcrawl.settings import Settings
from redcrawl.transport import redis_errors

__all__ = ["ListsFrontier", "PendingSettle"]

log = logging.getLogger(__name__)

_SCRIPTS = ("push", "lease", "ack", "settle", "nack", "release", "maintain", "requeue_dead",
            "release_worker", "renew", "repair")
MAINTAIN_LIMIT = 1000
"""Most delayed requests promoted and expired leases reclaimed by one script call."""


def _files(name: str, mode: Mode, backend: str = "lists") -> tuple[str, ...]:
    """A frontier script's files: base.lua, lib.lua, the dedupe prelude, the backend's
    ready-queue layer (``queue_<backend>.lua``), ops.lua, then the script
    (``<name>_<backend>.lua`` if the backend has its own)."""
    own = f"frontier/lua/{name}_{backend}.lua"
    script = own if scripts.exists(own) else f"frontier/lua/{name}.lua"
    return (scripts.BASE, "frontier/lua/lib.lua", *dedupe.prelude(mode),
            f"frontier/lua/queue_{backend}.lua", "frontier/lua/ops.lua", script)


def record(env: Envelope) -> bytes:
    """The stored form of a new request: the state header ``<priority>|<attempts>|<lease
    token>|`` and the encoded envelope (without the fingerprint, which is the id)."""
    return b"%d|0||%s" % (env.priority, codec.encode(env, fingerprint=False))


_HEAD_NUMBER = re.compile(rb"-?[0-9]{1,15}")
"""A number of a record's header, as ``parse_head`` in ``lua/lib.lua`` reads it (Lua
would print anything past 2^53 as ``1e+20``)."""
_INTEGER = re.compile(rb"-?[0-9]{1,18}")
"""A counter or time as the scripts accept it (``int_ok`` in ``lua/lib.lua``)."""
_LAYOUT = re.compile(rb"[a-z][a-z/0-9]* [-0-9,]* [a-z]+[ A-Za-z0-9.+-]*")
"""A well-formed stored layout (``layout_ok`` in ``lua/lib.lua``)."""


def stored_int(raw: bytes | None) -> int | None:
    """A stored counter or time (None: missing, 0), or None if it is corrupt."""
    if raw is None:
        return 0
    return int(raw) if _INTEGER.fullmatch(raw) else None


def stored_layout(control: dict[bytes, bytes]) -> bytes | None:
    """The layout a crawl was created with, from its control hash (``layout``, or
    ``layout.copy`` if that one is corrupt); None for a new crawl. Raises
    :class:`FrontierError` when neither copy is readable."""
    first, copy = control.get(b"layout"), control.get(b"layout.copy")
    for raw in (first, copy):
        if raw is not None and _LAYOUT.fullmatch(raw):
            return raw
    if first is None and copy is None:
        return None
    raise FrontierError(f"crawl layout unreadable: the control hash holds layout {first!r} "
                        f"and layout.copy {copy!r}; if you know the settings the crawl was "
                        "created with, set both fields to the layout a worker with those "
                        "settings uses, or purge the crawl")


def parse_record(data: bytes) -> tuple[int, int, str, bytes]:
    """(priority, attempts, lease token, envelope bytes) of a stored record."""
    parts = data.split(b"|", 3)
    try:
        if (len(parts) != 4 or not _HEAD_NUMBER.fullmatch(parts[0])
                or not _HEAD_NUMBER.fullmatch(parts[1]) or parts[1].startswith(b"-")):
            raise ValueError
        return int(parts[0]), int(parts[1]), parts[2].decode(), parts[3]
    except (ValueError, UnicodeDecodeError):
        raise DecodeError("stored record has no state header") from None


def from_record(data: bytes) -> Envelope:
    """The envelope of a stored record; :class:`DecodeError` if corrupt."""
    return codec.decode(parse_record(data)[3])


class ListsFrontier:
    """A crawl frontier on Redis lists and sorted sets.

    ``clock``, if given, returns the time in milliseconds used instead of the server's
    clock (tests use it to move time; production uses the server's ``TIME`` so that the
    workers' clocks never matter).
    """

    BACKEND = "lists"

    def __init__(
        self,
        client: redis.Redis,
        settings: Settings,
        crawl: str,
        *,
        clock: Callable[[], int] | None = None,
    ) -> None:
        # redis-py's annotations mix its sync and async return types; treat replies as Any.
        self.client: Any = client
        self.settings = settings
        self.keys = CrawlKeys(crawl, prefix=settings.key_prefix, tiers=settings.tiers)
        self.crawl = crawl
        self._clock = clock
        self._keys = self._script_keys()
        self.dedupe: DedupeSpec = dedupe.resolve_spec(settings, client=client,
                                                      created=self._created_dedupe())
        self.done = Filter(client, self.dedupe, self.keys.fp_done, clock=clock)
        """The filter of DONE fingerprints (health, memory; the scripts embed it)."""
        self._common = [self._layout(), ",".join(map(str, settings.tier_bounds)),
                        self.dedupe.encode()]
        self._schedule = fair_schedule(settings.tier_weights)
        self._scripts = scripts.Scripts(
            client, {n: _files(n, self.dedupe.mode, self.BACKEND) for n in _SCRIPTS}
            | {"purge": ("frontier/lua/purge.lua",)})
        self._pipe = _Pipe(self)
        self._call_seq = 0

    # --- plumbing ------------------------------------------------------------------
    def _script_keys(self) -> list[str]:
        return self.keys.script_keys()

    def _layout(self) -> str:
        """ARGV[1] of every script: the queue layout (part of the crawl's fixed layout)."""
        return self.settings.ordering

    def _created_dedupe(self) -> str | None:
        """The dedupe spec the crawl was created with (needed to resolve an automatic
        Bloom backend, and an exact filter's legacy plan), or None for a new crawl."""
        if self.settings.dedupe == "bloom" and self.settings.bloom_backend != "auto":
            return None
        with redis_errors("reading the crawl layout"):
            raw = stored_layout(self.client.hgetall(self.keys.control))
        parts = raw.decode().split(" ", 2) if raw else []
        return parts[2] if len(parts) == 3 else None

    def _run(self, name: str, args: Sequence[Any], client: Any = None) -> Any:
        return self._scripts.run(name, self._keys, self._argv(args), client=client)

    def _ms(self, seconds: float | None, default: float) -> int:
        return int(1000 * (default if seconds is None else seconds))

    # --- transitions ---------------------------------------------------------------
    def push(self, envelopes: Sequence[Envelope], *, delay: float = 0.0,
             recrawl: bool = False) -> PushResult:
        """Dedupe and enqueue; returns which were accepted. One round trip per batch.
        With ``delay`` (seconds), accepted requests become READY only after that long.
        With ``recrawl``, requests already DONE are accepted again (a request still stored
        — ready, delayed, in flight or dead — stays a duplicate)."""
        if delay <= 0 and not recrawl:
            return self.settle(push=envelopes).pushed
        flags: list[bool] = []
        step = self.settings.batch_size
        for start in range(0, len(envelopes), step):
            out = self._run("push", [self._ms(delay, 0), int(recrawl), self._nonce(""),
                                     *self._push_args(envelopes[start:start + step])])
            flags += [c == ord("1") for c in out]
        accepted = sum(flags)
        return PushResult(accepted, len(flags) - accepted, tuple(flags))

    def _push_args(self, envelopes: Sequence[Envelope]) -> list[Any]:
        args: list[Any] = []
        for env in envelopes:
            fp = b"" if env.dont_filter or env.fingerprint is None else env.fingerprint
            args += (record(env), fp, env.priority)
        return args

    def lease(self, worker: str, n: int, ttl: float | None = None) -> list[Lease]:
        """Hand up to ``n`` ready requests to ``worker`` for ``ttl`` seconds."""
        if n <= 0:
            return []
        raw = self._run("lease", self._lease_args(worker, n, ttl))
        return self._leases(worker, raw)

    def ack(self, leases: Sequence[Lease]) -> int:
        """IN-FLIGHT -> DONE. Stale leases (expired and handed out again) are ignored.
        Returns how many were acked."""
        return self.settle(ack=leases).acked

    def settle(self, push: Sequence[Envelope] = (), ack: Sequence[Lease] = (), *,
               lease: tuple[str, int] | None = None, ttl: float | None = None) -> Settled:
        """A worker's round trip, atomic and in this order: store ``push`` (deduped), ack
        ``ack``, then (``lease=(worker, n)``) lease up to n more. Children are therefore
        always stored before their parent is acknowledged. One script call per
        ``batch_size`` pushes; the acks and the lease ride on the last one."""
        calls = self._settle_calls(push, ack, lease, ttl)
        return self._settled(calls, [self._run("settle", args) for args in calls], ack)

    def settle_begin(self, push: Sequence[Envelope] = (), ack: Sequence[Lease] = (), *,
                     lease: tuple[str, int] | None = None,
                     ttl: float | None = None) -> PendingSettle:
        """:meth:`settle`, sent now and read later: the worker goes on with its own work
        while Redis runs the call, and ``.result()`` returns what :meth:`settle` would
        have. Several may be on their way; Redis runs them in the order they were begun
        (on a connection of their own: finish them before a :meth:`settle`, ``nack`` or
        the like whose order matters). A lost connection falls back to retried
        :meth:`settle` calls (a call's nonce makes the retry of a call that did run
        return its outcome)."""
        return PendingSettle(self, self._settle_calls(push, ack, lease, ttl), ack)

    def _settle_calls(self, push: Sequence[Envelope], ack: Sequence[Lease],
                      lease: tuple[str, int] | None,
                      ttl: float | None) -> list[list[Any]]:
        """The settle script calls of one settle: the ARGV of each after the common
        ones."""
        calls: list[list[Any]] = []
        step = self.settings.batch_size
        starts = list(range(0, len(push), step)) or [0]
        for i, start in enumerate(starts):
            chunk = push[start:start + step]
            last = i == len(starts) - 1
            acks = ack if last else ()
            want = lease if last and lease is not None else ("", 0)
            if not chunk and not acks and not want[1]:
                continue
            worker, n, *rest = self._lease_args(want[0], want[1], ttl)
            # (the worker and nonce of the call before it in a pipeline: see PendingSettle)
            args: list[Any] = [len(chunk), len(acks), n, worker, *rest, "", "",
                               *self._push_args(chunk)]
            for item in acks:
                args += (item.id, item.token)
            calls.append(args)
        return calls

    def _settled(self, calls: Sequence[list[Any]], replies: Sequence[Any],
                 ack: Sequence[Lease]) -> Settled:
        pushed: list[bool] = []
        acked = 0
        leases: list[Lease] = []
        unacked: tuple[Lease, ...] = ()
        for args, (out_push, out_ack, out_lease) in zip(calls, replies, strict=True):
            pushed += [c == ord("1") for c in out_push]
            flags = bytes(out_ack)
            acked += flags.count(b"1")
            if b"2" in flags:  # the acks ride on the last call: flags align with ack
                unacked = tuple(x for x, f in zip(ack, flags, strict=True) if f == ord("2"))
            if args[2]:
                leases = self._leases(args[3], out_lease)
        accepted = sum(pushed)
        return Settled(PushResult(accepted, len(pushed) - accepted, tuple(pushed)), acked,
                       leases, unacked)

    def _argv(self, args: Sequence[Any]) -> list[Any]:
        now = "" if self._clock is None else str(int(self._clock()))
        return [*self._common, now, *args]

    def _nonce(self, worker: str) -> bytes:
        """A fresh nonce for one state-changing call: a retry of this very call (redis-py
        resends it when the reply is lost) gets the first execution's outcome back
        (call_replay, ops.lua). Its first byte picks the slot the call is kept in: a
        worker's calls in a row take its slots in turn, a call without a worker one of
        256 shared slots at random."""
        if not worker:
            return os.urandom(8)
        self._call_seq = (self._call_seq + 1) % CALL_SLOTS
        return bytes([self._call_seq]) + os.urandom(7)

    def _lease_args(self, worker: str, n: int, ttl: float | None) -> list[Any]:
        return [worker, n, self._ms(ttl, self.settings.lease_ttl), self.settings.max_attempts,
                self._schedule, MAINTAIN_LIMIT, self._nonce(worker)]

    def _leases(self, worker: str, raw: Sequence[Any]) -> list[Lease]:
        """Lease objects from a lease reply; undecodable requests are dead-lettered."""
        leases: list[Lease] = []
        if not raw:
            return leases
        bad: list[tuple[bytes, str, str]] = []
        token = bytes(raw[0]).decode()
        for i in range(1, len(raw), 3):
            rid, attempts, data = bytes(raw[i]), int(raw[i + 1]), bytes(raw[i + 2])
            try:
                env = from_record(data)
            except DecodeError as exc:
                bad.append((rid, token, f"undecodable envelope: {exc}"))
                continue
            if len(rid) == 20:
                env.fingerprint = rid
            leases.append(Lease(rid, token, worker, attempts, env))
        self._dead_letter(worker, bad)
        return leases

    def _dead_letter(self, worker: str, bad: Sequence[tuple[bytes, str, str]]) -> None:
        """Leased requests whose envelope cannot be decoded: (id, token, why) to DEAD, with
        a log line (both backends' lease replies)."""
        if bad:
            log.error("dead-lettering %d undecodable request(s) in crawl %s: %s",
                      len(bad), self.crawl, bad[0][2])
            self._nack_raw(worker, [(rid, token, why, -1) for rid, token, why in bad])

    def release(self, leases: Sequence[Lease]) -> int:
        """Give leased requests back unprocessed (IN-FLIGHT -> READY, served next), without
        counting the delivery as an attempt. Returns how many were given back."""
        if not leases:
            return 0
        worker = leases[0].worker
        args: list[Any] = [worker, self._nonce(worker)]
        for lease in leases:
            args += (lease.id, lease.token)
        return int(self._run("release", args))

    def nack(self, lease: Lease, error: str, *, retry: bool = True,
             delay: float | None = None) -> str:
        """A failed attempt. With ``retry`` it goes to DELAYED for ``delay`` seconds
        (default: exponential backoff by attempts) unless its attempts are used up;
        otherwise to DEAD. Returns "retried", "dead" or "stale"."""
        ms = -1 if not retry else self._ms(delay, self.settings.retry_delay(lease.attempts))
        flag = self._nack_raw(lease.worker, [(lease.id, lease.token, error, ms)])
        return {"r": "retried", "d": "dead"}.get(flag, "stale")

    def dead_letter(self, lease: Lease, error: str) -> str:
        """IN-FLIGHT -> DEAD now (e.g. a request the worker can't ever process)."""
        return self.nack(lease, error, retry=False)

    def _nack_raw(self, worker: str, quads: Sequence[tuple[bytes, str, str, int]]) -> str:
        args: list[Any] = [self.settings.max_attempts, worker, self._nonce(worker)]
        for q in quads:
            args += q
        out: bytes = self._run("nack", args)
        return out.decode()

    def renew(self, worker: str, ttl: float | None = None) -> None:
        """Heartbeat: ``worker`` and all its leases are alive for ``ttl`` more seconds."""
        self._run("renew", [worker, self._ms(ttl, self.settings.lease_ttl)])

    def release_worker(self, worker: str) -> int:
        """Give up all of ``worker``'s leases now (force-reclaim / clean shutdown)."""
        n = int(self._run("release_worker", [worker]))
        self.maintain()
        return n

    def maintain(self) -> tuple[int, int]:
        """Promote due delayed requests and reclaim expired leases.
        Returns (promoted, reclaimed). ``lease`` does this too."""
        promoted, reclaimed = self._run("maintain", [self.settings.max_attempts, MAINTAIN_LIMIT,
                                                     self._ms(None, self.settings.lease_ttl)])
        return int(promoted), int(reclaimed)

    def requeue_dead(self, ids: Sequence[str] | None = None, *, limit: int = 1000) -> int:
        """DEAD -> READY, with a fresh attempt budget: the given ids, or up to ``limit``."""
        if ids is None:
            return int(self._run("requeue_dead", [self._nonce(""), "*", limit]))
        if not ids:
            return 0
        return int(self._run("requeue_dead", [self._nonce(""), "ids", *map(parse_id, ids)]))

    # --- crawl-wide switches -------------------------------------------------------
    def pause(self) -> None:
        """Stop handing out requests (leases held stay valid; pushes still accepted)."""
        with redis_errors("pause"):
            self.client.hset(self.keys.control, "paused", "1")

    def resume(self) -> None:
        with redis_errors("resume"):
            self.client.hdel(self.keys.control, "paused")

    def is_paused(self) -> bool:
        with redis_errors("is_paused"):
            return bool(self.client.hget(self.keys.control, "paused") == b"1")

    def purge(self) -> None:
        """Delete the crawl's whole frontier state: queues, leases, dead letters, dedupe
        (only the id and token counters stay, so old leases stay stale)."""
        keys = [*self.keys.all_keys(), *self._extra_keys()]
        keys.remove(self.keys.stats)
        self._scripts.run("purge", [self.keys.stats, *keys], [])
        with redis_errors("purge"):
            self.done.clear()
            Filter(self.client, self.dedupe, self.keys.fp_seen).clear()

    def _extra_keys(self) -> list[str]:
        """Keys of the crawl's state beyond :meth:`CrawlKeys.all_keys` (purge deletes them)."""
        return []

    # --- inspection ----------------------------------------------------------------
    def counts(self, *, repaired: bool = False) -> Counts:
        """A consistent snapshot (one MULTI/EXEC) of the conservation terms. A corrupt
        counter is repaired first (:meth:`repair`)."""
        k = self.keys
        with redis_errors("counts"):
            pipe = self.client.pipeline(transaction=True)
            pipe.hmget(k.stats, "accepted", "filtered", "done", "retried", "reclaimed",
                       "requeued", "inflight")
            for t in range(k.tiers):
                if self.settings.ordering == "priority":
                    pipe.zcard(k.ready(t))
                else:
                    pipe.llen(k.ready(t))
            pipe.zcard(k.delayed)
            pipe.zcard(k.dead)
            res = pipe.execute()
        stats = self._counters(res[0], repaired)
        if stats is None:
            return self._repaired_counts(repaired)
        ready = sum(res[1:1 + k.tiers])
        delayed, dead = res[1 + k.tiers:]
        return Counts(accepted=stats[0], filtered=stats[1], ready=ready, delayed=delayed,
                      in_flight=stats[6], done=stats[2], dead=dead, retried=stats[3],
                      reclaimed=stats[4], requeued=stats[5])

    def _counters(self, raw: Sequence[bytes | None], repaired: bool) -> list[int] | None:
        """Stored counters as ints; None if one is corrupt (the caller repairs them and
        reads again), a :class:`FrontierError` if they are still corrupt after a repair."""
        values = [stored_int(x) for x in raw]
        if all(v is not None for v in values):
            return [v for v in values if v is not None]
        if repaired:
            raise FrontierError(f"crawl {self.crawl!r}: its counters {list(raw)!r} are corrupt "
                                "and could not be repaired; purge the crawl")
        return None

    def _repaired_counts(self, repaired: bool) -> Counts:
        assert not repaired
        try:
            done = self.repair()
        except FrontierError as exc:  # e.g. a reader with other dedupe settings
            raise FrontierError(f"crawl {self.crawl!r} has a corrupt counter, which the next "
                                f"call of one of its workers repairs; this process could "
                                f"not repair it: {exc}") from exc
        log.warning("crawl %s: corrupt counters repaired: %s", self.crawl,
                    "; ".join(done) or "(by another process)")
        return self.counts(repaired=True)

    def repair(self) -> list[str]:
        """Check the crawl's counters and layout and repair the corrupt ones (every
        frontier script does this before its first write; :meth:`counts` calls this when
        it reads a corrupt counter). Returns what was repaired, one line each."""
        return [bytes(x).decode(errors="replace") for x in self._run("repair", [])]

    def _envelopes(self, ids: Sequence[bytes]) -> list[Envelope | None]:
        if not ids:
            return []
        out: list[Envelope | None] = []
        for data in self.client.hmget(self.keys.req, list(ids)):
            try:
                out.append(from_record(data) if data is not None else None)
            except DecodeError:
                out.append(None)
        return out

    def pending(self, limit: int = 100) -> list[PendingInfo]:
        """Ready requests, next to be served first within each tier."""
        out: list[PendingInfo] = []
        with redis_errors("pending"):
            for t in range(self.keys.tiers):
                key = self.keys.ready(t)
                if self.settings.ordering == "priority":
                    ids = self.client.zrange(key, 0, limit - 1)
                elif self.settings.ordering == "fifo":
                    ids = self.client.lrange(key, -limit, -1)[::-1]
                else:
                    ids = self.client.lrange(key, 0, limit - 1)
                for rid, env in zip(ids, self._envelopes(ids), strict=True):
                    out.append(PendingInfo(format_id(rid), t, env.url if env else "?",
                                           env.priority if env else 0))
        return out[:limit]

    def inflight(self, limit: int = 100) -> list[InflightInfo]:
        """Leased requests: which worker, since when, until when (soonest deadline first)."""
        out: list[InflightInfo] = []
        with redis_errors("inflight"):
            leases = self.client.zrange(self.keys.inflight, 0, -1, withscores=True)
            for token, deadline in leases:
                lease = _lease_record(self.client.hget(self.keys.leases, token))
                if lease is None:
                    continue  # gone, or corrupt (reclaimed when it expires)
                since, worker, ids = lease
                recs = self.client.hmget(self.keys.req, ids) if ids else []
                for rid, rec in zip(ids, recs, strict=True):
                    if rec is None:
                        continue
                    try:
                        _p, attempts, held_by, body = parse_record(rec)
                        url = codec.decode(body).url
                    except DecodeError:
                        continue
                    if held_by != token.decode():
                        continue
                    out.append(InflightInfo(format_id(rid), worker, attempts, since / 1000,
                                            deadline / 1000, url))
                    if len(out) >= limit:
                        return out
        return out

    def dead(self, limit: int = 100) -> list[DeadInfo]:
        """Dead-lettered requests with their last error, oldest first."""
        with redis_errors("dead"):
            rows = self.client.zrange(self.keys.dead, 0, limit - 1, withscores=True)
            ids = [r[0] for r in rows]
            errs = self.client.hmget(self.keys.err, ids) if ids else []
            recs = self.client.hmget(self.keys.req, ids) if ids else []
        out = []
        for (rid, ts), e, rec in zip(rows, errs, recs, strict=True):
            attempts, url = 0, "?"
            try:
                if rec is not None:
                    _p, attempts, _t, body = parse_record(rec)
                    url = codec.decode(body).url
            except DecodeError:
                pass
            out.append(DeadInfo(format_id(rid), ts / 1000, (e or b"").decode(errors="replace"),
                                attempts, url))
        return out

    def describe(self, id: str) -> RequestInfo | None:
        """Where the request ``id`` (as printed by :func:`format_id`) is, or None if it is
        not stored (unknown, or DONE)."""
        rid = parse_id(id)
        k = self.keys
        with redis_errors("describe"):
            pipe = self.client.pipeline(transaction=True)
            pipe.hget(k.req, rid)
            pipe.zscore(k.delayed, rid)
            pipe.zscore(k.dead, rid)
            pipe.hget(k.err, rid)
            rec, due, died, err = pipe.execute()
            if rec is None:
                return None
            try:
                _p, attempts, token, body = parse_record(rec)
                env: Envelope | None = codec.decode(body)
            except DecodeError:
                attempts, token, env = 0, "", None
            worker = None
            if token:
                lease = _lease_record(self.client.hget(k.leases, token))
                worker = lease[1] if lease else None
        if env is not None and len(rid) == 20:
            env.fingerprint = rid
        state = ("in_flight" if token else "dead" if died is not None
                 else "delayed" if due is not None else "ready")
        return RequestInfo(id=format_id(rid), state=state, attempts=attempts, envelope=env,
                           worker=worker, due=due / 1000 if due is not None else None,
                           error=err.decode(errors="replace") if err else None)

    def server_time(self) -> float:
        """The Redis server's clock (seconds since the epoch): the clock of every deadline."""
        with redis_errors("time"):
            sec, usec = self.client.time()
        return float(sec) + float(usec) / 1e6

    def forget_worker(self, worker: str) -> None:
        """Remove a worker's heartbeat (it is closing; its leases are already given back)."""
        with redis_errors("forget_worker"):
            self.client.hdel(self.keys.workers, worker)
            self.client.hdel(self.keys.calls, *self.keys.call_fields(worker))

    _OWN_COUNTERS = frozenset(("seq", "leases", "inflight", "accepted", "filtered", "done",
                               "retried", "reclaimed", "died", "requeued"))

    def add_stats(self, **deltas: int) -> None:
        """Add to crawl-wide counters outside the state machine (e.g. ``items=3`` from a
        worker's item pipeline), for progress displays."""
        clash = self._OWN_COUNTERS & set(deltas)
        if clash:
            raise FrontierError(f"add_stats cannot change the state machine's own counters "
                                f"({', '.join(sorted(clash))})")
        deltas = {k: v for k, v in deltas.items() if v}
        if not deltas:
            return
        with redis_errors("add_stats"):
            pipe = self.client.pipeline(transaction=False)
            for name, value in deltas.items():
                pipe.hincrby(self.keys.stats, name, value)
            pipe.execute()

    def stats(self) -> dict[str, int]:
        """Every crawl-wide counter (the conservation terms' counters and add_stats');
        a corrupt one is left out, with a warning (the state machine's own are repaired
        by the next script)."""
        with redis_errors("stats"):
            raw = self.client.hgetall(self.keys.stats)
        out: dict[str, int] = {}
        for k, v in raw.items():
            value = stored_int(v)
            if value is None:
                log.warning("crawl %s: counter %r holds %r, not an integer: left out",
                            self.crawl, k, v)
            else:
                out[k.decode(errors="replace")] = value
        return out

    def workers(self) -> dict[str, float]:
        """Worker id -> heartbeat deadline (seconds since the epoch; 0 for a corrupt one:
        the scripts read it as a stopped heartbeat)."""
        with redis_errors("workers"):
            raw = self.client.hgetall(self.keys.workers)
        return {k.decode(errors="replace"): (stored_int(v) or 0) / 1000 for k, v in raw.items()}


def _lease_record(raw: bytes | None) -> tuple[int, str, list[bytes]] | None:
    """(since ms, worker, ids) of a stored lease record; None if missing or corrupt."""
    if raw is None:
        return None
    try:
        since, worker, *ids = msgpack.unpackb(raw, raw=True)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    if not (isinstance(since, int) and isinstance(worker, bytes)
            and all(isinstance(i, bytes) for i in ids)):
        return None
    return since, worker.decode(errors="replace"), ids


class PendingSettle:
    """A :meth:`ListsFrontier.settle` on its way. All of a frontier's pending settles go
    out, in order, on one connection of their own, so Redis runs them in the order they
    were begun (a parent's ack never overtakes its children's push), and their replies
    are read in that order too.

    Each call names the call begun before it (its worker and nonce): if Redis refused
    that one (out of memory, say) and runs this one, this one does not acknowledge its
    parents (their children may have been in the refused call) and hands them back in
    :attr:`Settled.unacked`; so does every later call of the chain, until the refusal has
    been read (:meth:`result`), after which new settles start a new chain."""

    def __init__(self, frontier: ListsFrontier, calls: list[list[Any]],
                 ack: Sequence[Lease] = ()) -> None:
        self._frontier = frontier
        self.calls = calls
        self.ack = ack
        pipe = frontier._pipe
        for args in calls:
            args[9], args[10] = pipe.last
            pipe.last = (args[3], args[8])
        self.replies: list[Any] = []
        self.sent = False
        """Whether the calls went out (else :meth:`result` runs them the ordinary way)."""
        self.outcome: Settled | None = None
        self.error: BaseException | None = None
        frontier._pipe.send(self)

    def result(self) -> Settled:
        """Wait for the reply (reading those of earlier pending settles first) and return
        what :meth:`ListsFrontier.settle` would have. Raises what it raises (an earlier
        settle's error is kept for that one's own :meth:`result`)."""
        pipe = self._frontier._pipe
        while self.outcome is None and self.error is None:
            oldest = pipe.queue[0]
            try:
                pipe.finish_oldest()
            except BaseException:
                if oldest is self:
                    raise
        if self.error is not None:
            raise self.error
        assert self.outcome is not None
        return self.outcome


class _Pipe:
    """The connection and queue of a frontier's pending settles."""

    def __init__(self, frontier: ListsFrontier) -> None:
        self.frontier = frontier
        self.conn: Any = None
        self.broken = False
        self.loaded = False
        self.queue: deque[PendingSettle] = deque()
        self.last: tuple[str, bytes] = ("", b"")
        """Worker and nonce of the last call begun: the next one names it."""

    def send(self, call: PendingSettle) -> None:
        f = self.frontier
        self.queue.append(call)
        pool = getattr(f.client, "connection_pool", None)
        if not call.calls or pool is None or self.broken:
            return
        script, keys = f._scripts["settle"], f._keys
        try:
            if self.conn is None:
                self.conn = pool.get_connection()
                if not self.loaded:  # so that NOSCRIPT is only ever a server restart
                    f.client.script_load(script.script)
                    self.loaded = True
            self.conn.send_packed_command(self.conn.pack_commands(
                [("EVALSHA", script.sha, len(keys), *keys, *f._argv(args))
                 for args in call.calls]))
            call.sent = True
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            self._break()

    def finish_oldest(self) -> None:
        call = self.queue[0]
        f = self.frontier
        try:
            if call.sent and not self.broken:
                try:
                    while len(call.replies) < len(call.calls):
                        try:
                            reply = self.conn.read_response()
                        except redis.exceptions.NoScriptError:
                            reply = None  # not run (the server lost its scripts): run below
                        except redis.exceptions.ResponseError as exc:
                            reply = exc
                        call.replies.append(reply)
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    # what ran is replayed (lease nonce) or deduplicated by the retry
                    self._break()
            error = next((r for r in call.replies if isinstance(r, Exception)), None)
            if error is not None:
                raise FrontierError(f"Redis refused settle: {error}") from error
            # whatever did not run, or whose reply was lost, runs now, in order
            replies = [r if r is not None else f._run("settle", args)
                       for args, r in zip(call.calls, call.replies, strict=False)]
            replies += [f._run("settle", args) for args in call.calls[len(replies):]]
            call.outcome = f._settled(call.calls, replies, call.ack)
        except BaseException as exc:
            call.error = exc
            self.last = ("", b"")  # seen: settles begun from now on start a new chain
            raise
        finally:
            self.queue.popleft()
            if not self.queue:
                self._release()

    def _break(self) -> None:
        """The connection failed: what is still queued runs the ordinary way."""
        self.broken = True
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.disconnect()
            self.frontier.client.connection_pool.release(conn)

    def _release(self) -> None:
        self.broken = False
        conn, self.conn = self.conn, None
        if conn is not None:
            self.frontier.client.connection_pool.release(conn)
