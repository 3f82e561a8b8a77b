# Over 450 lines: the one class both backends share (records.py and settle.py are split out).
"""The backend-neutral frontier: :class:`FrontierCore`, the interface every caller uses
(``open_frontier`` returns it) and everything both backends share: argument building and
call nonces, settle batching, the one decode loop for leased requests, nack, renew,
release, requeue, maintain, counters and heartbeats, pause, purge and inspection. Its
fleet-wide politeness operations are in :mod:`.polite` (a base class).

A backend (:class:`~redcrawl.frontier.lists.ListsFrontier`,
:class:`~redcrawl.frontier.streams.StreamsFrontier`) is the *queue layer* only: how READY
and IN-FLIGHT requests are kept. In Lua that is ``lua/queue_<backend>.lua`` (its hooks
are declared in ``lua/lib.lua``); in Python it is these members, all declared here and
nothing else overridden:

=====================  ================================================================
``BACKEND``            the backend's name: picks ``lua/queue_<BACKEND>.lua``
``STANDALONE``         scripts of the backend's own, without the prelude (name -> files)
``_script_keys()``     KEYS of every frontier script (``lua/lib.lua``'s fixed 12, then
                       the queue layer's keys)
``_layout()``          ARGV[1] of every script: the queue layout (stored with the crawl)
``_push_extra(envs)``  the queue layer's fields of each pushed request, after (record,
                       fingerprint, priority): as many as its ``PUSH_STRIDE`` - 3 (the
                       dedupe's member and bucket follow them: ``op_push``)
``_count_states()``    one consistent read of the counters and the queue sizes
``_count_call()``      the same read as one standalone script ``counts`` (KEYS, ARGV), for
                       pipelining the partitions of a partitioned crawl
``_ready_ids(limit)``  ready ids, next served first, as (tier, ids) batches
``_held(limit)``       what the leases claim to hold, as batches of :class:`Held`
``_holder(token)``     the worker holding a lease token
``_extra_keys()``      the queue layer's keys beyond ``CrawlKeys.all_keys`` (purge)
``_purge_extra()``     what purge deletes after its script (lists: per-key politeness keys)
``_politeness_mode()`` the politeness key mode of the crawl, or None (lists only)
``_forget_consumers``  what the queue layer keeps of a worker that is closing
=====================  ================================================================

Every lease reply, from ``lease.lua`` and ``settle.lua`` of either backend, is a flat list
of (id, attempts, record, token) per leased request (``op_lease`` in ``lua/ops.lua``),
decoded by :meth:`FrontierCore._leases`, with the server time of the grant (lease.lua: the
list's last item; settle.lua: the reply's fourth; absent from a replayed call), from which
each lease gets ``granted`` (:mod:`redcrawl.frontier.grant_clock`).
"""

from __future__ import annotations

import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, cast

import redis

from redcrawl import codec, dedupe, scripts
from redcrawl.codec import Envelope
from redcrawl.dedupe import DedupeSpec, Filter, Mode
from redcrawl.errors import DecodeError, EncodeError, FrontierError
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
from redcrawl.frontier.durability import WAITED, CrawlIdentity, ReplicaWait, works
from redcrawl.frontier.grant_clock import GrantClock
from redcrawl.frontier.polite import PolitenessOps, slot_outcome
from redcrawl.frontier.records import (
    from_record,
    layout_without_stamps,
    lease_state_out,
    parse_record,
    record,
    stored_int,
    stored_layout,
)
from redcrawl.frontier.settle import PendingSettle, SettlePipe
from redcrawl.keys import CALL_SLOTS, CrawlKeys, crawl_registry
from redcrawl.politeness import KeyMode, politeness_key
from redcrawl.settings import Settings
from redcrawl.transport import redis_errors

__all__ = [
    "MAINTAIN_LIMIT",
    "FrontierCore",
    "HeartbeatCounters",
    "Held",
    "push_stamp",
    "slot_outcome",
]


log = logging.getLogger(__name__)

_SCRIPTS = (
    "push",
    "lease",
    "ack",
    "settle",
    "nack",
    "release",
    "maintain",
    "requeue_dead",
    "release_worker",
    "disown",
    "renew",
    "repair",
    "free",
    "defer",
    "charge",
    "retry_start",
    "drop_auto_delay",
)
MAINTAIN_LIMIT = 1000
"""Most delayed requests promoted and expired leases reclaimed by one script call."""


def script_files(name: str, mode: Mode, backend: str) -> tuple[str, ...]:
    """A frontier script's files: base.lua, lib.lua, the dedupe prelude, polite.lua
    (fleet-wide politeness, both backends), the backend's queue layer
    (``queue_<backend>.lua``), latency.lua, ops.lua, then the script ``<name>.lua``."""
    return (
        scripts.BASE,
        "frontier/lua/lib.lua",
        *dedupe.prelude(mode),
        "frontier/lua/polite.lua",
        f"frontier/lua/queue_{backend}.lua",
        "frontier/lua/latency.lua",
        "frontier/lua/ops.lua",
        f"frontier/lua/{name}.lua",
    )


def _decoded(rec: bytes | None) -> tuple[int, str, Envelope | None] | None:
    """(attempts, token, envelope) of a stored record: None if it is missing or its header
    is unreadable, the envelope None if only that is."""
    if rec is None:
        return None
    try:
        _p, attempts, token, body = parse_record(rec)
    except DecodeError:
        return None
    try:
        return attempts, token, codec.decode(body)
    except DecodeError:
        return attempts, token, None


def push_stamp(ms: int) -> bytes:
    """A record's push stamp (``lua/latency.lua``): the byte 127, then the time in
    milliseconds as 7 base-64 digits, each the byte 48 + its value (read back by
    :func:`redcrawl.frontier.records.push_time`)."""
    digits = bytearray(7)
    for i in range(6, -1, -1):
        digits[i] = 48 + ms % 64
        ms //= 64
    return b"\x7f" + bytes(digits)


class HeartbeatCounters(Protocol):
    """What a worker adds to the crawl with each heartbeat (:meth:`FrontierCore.renew`)."""

    def take(self) -> tuple[dict[str, int], dict[str, int], dict[str, str]]:
        """(fleet totals to add, the worker's totals to add, its gauges to set), counted
        since the last take."""
        ...

    def give_back(self, totals: dict[str, int], mine: dict[str, int]) -> None:
        """Counts of a take whose heartbeat failed, for the next one."""
        ...


@dataclass(frozen=True, slots=True)
class Held:
    """A request a lease claims to hold (:meth:`FrontierCore._held`); it is listed in
    flight if its record still carries a token ``holds`` accepts."""

    id: bytes
    worker: str
    since: float
    """Seconds since the epoch."""
    deadline: float
    holds: Callable[[str], bool]
    """Whether a record whose header token field is this holds under the lease."""
    ended: bool = False
    """Whether the record's attempts count only the deliveries that ended (a crawl whose
    records keep no lease state: :func:`~redcrawl.frontier.records.lease_state_out`)."""


def heartbeat_deadlines(hashes: Iterable[Mapping[bytes, bytes]]) -> dict[str, float]:
    """Worker id -> heartbeat deadline (seconds since the epoch; 0 for a corrupt one: the
    scripts read it as a stopped heartbeat), the latest over ``hashes`` (the workers hash
    of each partition)."""
    out: dict[str, float] = {}
    for raw in hashes:
        for name, value in raw.items():
            worker, until = name.decode(errors="replace"), (stored_int(value) or 0) / 1000
            out[worker] = max(until, out.get(worker, 0.0))
    return out


def consistent_read(
    client: Any, queue: Callable[[Any], None], *, raise_on_error: bool = True
) -> list[Any]:
    """The reads ``queue`` adds to a pipeline, in one MULTI (a consistent view). A Redis
    out of memory refuses every command queued in a MULTI, reads too: then they are read
    in a plain pipeline, since an inspection wanted right then beats a consistent one."""
    try:
        pipe = client.pipeline(transaction=True)
        queue(pipe)
        return list(pipe.execute(raise_on_error=raise_on_error))
    except redis.exceptions.OutOfMemoryError:
        pipe = client.pipeline(transaction=False)
        queue(pipe)
        return list(pipe.execute(raise_on_error=raise_on_error))


class FrontierCore(PolitenessOps, ABC):
    """A crawl frontier on Redis: the operations of every backend (see the module
    docstring for what a backend adds). This class is the frontier interface; callers
    type against it.

    ``clock``, if given, returns the time in milliseconds used instead of the server's
    clock (tests use it to move time; production uses the server's ``TIME`` so that the
    workers' clocks never matter).
    """

    BACKEND: ClassVar[str]
    STANDALONE: ClassVar[Mapping[str, tuple[str, ...]]] = {}

    def __init__(
        self,
        client: redis.Redis,
        settings: Settings,
        crawl: str,
        *,
        clock: Callable[[], int] | None = None,
        partition: int | None = None,
    ) -> None:
        if settings.backend != self.BACKEND:
            settings = settings.replace(backend=self.BACKEND)  # validates the ordering
        # redis-py's annotations mix its sync and async return types; treat replies as Any.
        self.client: Any = client
        self.settings = settings
        self.keys = CrawlKeys(
            crawl, prefix=settings.key_prefix, tiers=settings.tiers, partition=partition
        )  # (partition: one partition of a PartitionedFrontier, frontier/partitioned.py)
        self.crawl = crawl
        self._clock = clock
        self.politeness: str | None = self._politeness_mode()
        """The politeness key mode ("host", "domain") if the frontier enforces fleet-wide
        politeness for this crawl (lists crawls created with it), else None."""
        self._keys = self._script_keys()
        self.dedupe: DedupeSpec = dedupe.resolve_spec(
            settings, client=client, created=self._created_dedupe()
        )
        self.done = Filter(client, self.dedupe, self.keys.fp_done, clock=clock)
        """The filter of DONE fingerprints (health, memory; the scripts embed it)."""
        self._fpd = self.keys.fp_done.encode()  # (DedupeSpec.hints)
        self._common = [
            self._layout(),
            ",".join(map(str, settings.tier_bounds)),
            self.dedupe.encode(),
        ]
        self._schedule = fair_schedule(settings.tier_weights)
        self._scripts = scripts.Scripts(
            client,
            {n: script_files(n, self.dedupe.mode, self.BACKEND) for n in _SCRIPTS}
            | {"purge": ("frontier/lua/purge.lua",)}
            | dict(self.STANDALONE),
        )
        self._pipe = SettlePipe(self)
        self.replica_wait = ReplicaWait.of(settings, crawl)
        """REDCRAWL_WAIT_REPLICAS: the WAIT after each state change (None: off)."""
        self._identity = CrawlIdentity(client, self.keys.control, crawl)
        self._call_seq = 0
        self._grant_clock = GrantClock()  # this process's clock against this server's
        self._pol_stored = False  # the crawl's politeness defaults: stored at first push
        self._registered = False  # the crawl's name in the crawl registry: at first push

    # --- the queue layer (see the module docstring) ----------------------------------
    @abstractmethod
    def _script_keys(self) -> list[str]:
        """KEYS of every frontier script, in ``lua/lib.lua``'s order."""

    @abstractmethod
    def _layout(self) -> str:
        """ARGV[1] of every script: the queue layout (part of the crawl's fixed layout)."""

    @abstractmethod
    def _push_extra(self, envelopes: Sequence[Envelope]) -> Sequence[tuple[Any, ...]] | None:
        """The queue layer's own fields of each pushed request (its ``PUSH_STRIDE`` - 3),
        aligned with ``envelopes``; None if it has none."""

    @abstractmethod
    def _count_states(self) -> tuple[Sequence[Any], int, int, int]:
        """One consistent read: the counters accepted, filtered, done, retried, reclaimed,
        requeued as stored and the number in flight (a stored counter too, or a number),
        then the numbers ready, delayed and dead."""

    @abstractmethod
    def _count_call(self) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of the standalone script ``counts``: :meth:`_count_states`'s read
        in one atomic step, replying (the seven stored counters, ready, delayed, dead)."""

    @abstractmethod
    def _ready_ids(self, limit: int) -> Iterator[tuple[int, list[bytes]]]:
        """Ready ids, next to be served first, as (tier, up to ``limit`` ids) batches;
        :meth:`pending` stops reading once it has ``limit``."""

    @abstractmethod
    def _held(self, limit: int) -> Iterator[list[Held]]:
        """The requests the leases claim to hold, as batches; :meth:`inflight` reads
        their records and stops once it has ``limit``."""

    @abstractmethod
    def _holder(self, token: str) -> str | None:
        """The worker holding the lease ``token`` (a request's in-flight token)."""

    @abstractmethod
    def _extra_keys(self) -> list[str]:
        """Keys of the crawl's state beyond :meth:`CrawlKeys.all_keys` (purge deletes them)."""

    def _purge_extra(self) -> None:
        """Delete what the queue layer keeps under per-key names (after the purge script:
        there may be too many for one script call). Nothing by default."""
        return

    @abstractmethod
    def _forget_consumers(self, worker: str) -> None:
        """Forget what the queue layer keeps of ``worker`` (it is closing)."""

    # --- politeness (lists; see docs/politeness.md) -----------------------------------
    def _politeness_mode(self) -> str | None:
        """The key mode if this crawl has politeness: asked for by the settings and the
        crawl is new or was created with it (older crawls keep their layout)."""
        return None

    def _record(self, env: Envelope, stamp: bytes = b"") -> bytes:
        """The stored record of a pushed request (with its politeness key if the crawl
        has politeness, and its push ``stamp`` if given)."""
        if self.politeness is None:
            return record(env, None, stamp)
        slot = env.meta.get("download_slot") if isinstance(env.meta, dict) else None
        try:
            key = politeness_key(env.url, slot, cast(KeyMode, self.politeness))
        except (ValueError, TypeError) as exc:
            raise EncodeError(
                f"request {env.url!r} has no politeness key: {exc}; fix the "
                "URL, or set meta['download_slot'] to a string"
            ) from exc
        return record(env, key, stamp)

    # --- plumbing ------------------------------------------------------------------
    def _created_dedupe(self) -> str | None:
        """The dedupe spec the crawl was created with (needed to resolve an automatic
        Bloom backend, and an exact filter's legacy plan), or None for a new crawl."""
        if self.settings.dedupe == "bloom" and self.settings.bloom_backend != "auto":
            return None
        with redis_errors("reading the crawl layout"):
            raw = stored_layout(self.client.hgetall(self.keys.control))
        parts = layout_without_stamps(raw).decode().split(" ", 2) if raw else []
        return parts[2] if len(parts) == 3 else None

    def _run(self, name: str, args: Sequence[Any], client: Any = None) -> Any:
        if client is None and self.replica_wait is not None and name in WAITED:
            out = self.replica_wait.run(self, name, self._keys, self._argv(args))
        else:
            out = self._scripts.run(name, self._keys, self._argv(args), client=client)
        if client is None and self.check_vanished and works(name, args):
            self._identity.remember()  # (once) see durability.py
        return out

    def _argv(self, args: Sequence[Any]) -> list[Any]:
        now = "" if self._clock is None else str(int(self._clock()))
        return [*self._common, now, *args]

    def _ms(self, seconds: float | None, default: float) -> int:
        return int(1000 * (default if seconds is None else seconds))

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

    def _push_stamp(self) -> bytes:
        """The push stamp of a settle call sent now (lua/latency.lua's format): the time
        the script will read (the caller's clock if the frontier has one, else the
        server's as this process knows it: the lower bound of the clocks' offset that
        every settle reply tightens, :mod:`redcrawl.frontier.grant_clock`, within a few
        milliseconds), so that the script does not append it to every record it stores
        (a new record-sized Lua string each: ~2.9k instructions per pushed request);
        b"" when that time is unknown (no reply seen yet): the script stamps them."""
        if self._clock is not None:
            ms = int(self._clock())
        else:
            offset = self._grant_clock.offset
            if offset is None:
                return b""
            ms = int((time.monotonic() - offset) * 1000)
        return push_stamp(ms)

    def _push_args(self, envelopes: Sequence[Envelope], stamp: bytes = b"") -> list[Any]:
        if self.politeness is not None and not self._pol_stored and envelopes:
            self.store_politeness()  # (not at construction: readers must not write)
        if not self._registered and envelopes:
            self._registered = True
            try:
                with redis_errors("registering the crawl"):
                    self.client.sadd(crawl_registry(self.keys.prefix), self.crawl)
            except FrontierError as exc:  # e.g. an ACL without this key: readers SCAN
                log.warning("crawl %s not added to the crawl registry: %s", self.crawl, exc)
        args: list[Any] = []
        hints, base, record_of = self.dedupe.hints, self._fpd, self._record
        extra = self._push_extra(envelopes)
        for i, env in enumerate(envelopes):
            fp = env.fingerprint
            if env.dont_filter or fp is None:
                fp = b""
            args += (record_of(env, stamp), fp, env.priority)
            if extra is not None:
                args += extra[i]
            args += hints(fp, base)  # (the dedupe member and bucket: last, see op_push)
        return args

    def _lease_args(self, worker: str, n: int, ttl: float | None) -> list[Any]:
        return [
            worker,
            n,
            self._ms(ttl, self.settings.lease_ttl),
            self.settings.max_attempts,
            self._schedule,
            MAINTAIN_LIMIT,
            self._nonce(worker),
        ]

    def _leases(
        self, worker: str, raw: Sequence[Any], sent: float = 0.0, server_ms: Any = None
    ) -> list[Lease]:
        """Lease objects from a lease reply (id, attempts, record, token per request, and
        from lease.lua the grant's server time last); undecodable requests are
        dead-lettered. ``sent``: when the call was sent (``time.monotonic()``, 0 if
        unknown), ``server_ms``: the server time of a settle call (its reply's fourth
        item): with them each lease gets ``granted``, a lower bound of when it was
        granted on this process's clock."""
        leases: list[Lease] = []
        bad: list[tuple[bytes, str, str]] = []
        received = time.monotonic()
        raw = raw or ()
        if len(raw) % 4 == 1:  # (lease.lua: the grant's time last)
            raw, server_ms = raw[:-1], raw[-1]
        granted = 0.0
        if sent or server_ms is not None:
            granted = self._grant_clock.granted(
                sent, None if server_ms is None else int(server_ms), received
            )
        for i in range(0, len(raw), 4):  # (redis-py replies bulk strings as bytes)
            rid, attempts, data, token = raw[i], int(raw[i + 1]), raw[i + 2], raw[i + 3].decode()
            try:
                env = from_record(data)
            except DecodeError as exc:
                bad.append((rid, token, f"undecodable envelope: {exc}"))
                continue
            if len(rid) == 20:
                env.fingerprint = rid
            leases.append(Lease(rid, token, worker, attempts, env, received, granted))
        if bad:
            log.error(
                "dead-lettering %d undecodable request(s) in crawl %s: %s",
                len(bad),
                self.crawl,
                bad[0][2],
            )
            self._nack_raw(worker, [(rid, token, why, -1) for rid, token, why in bad])
        return leases

    # --- transitions ---------------------------------------------------------------
    def push(
        self, envelopes: Sequence[Envelope], *, delay: float = 0.0, recrawl: bool = False
    ) -> PushResult:
        """Dedupe and enqueue; returns which were accepted. One round trip per batch.
        With ``delay`` (seconds), accepted requests become READY only after that long.
        With ``recrawl``, requests already DONE are accepted again (a request still stored
        — ready, delayed, in flight or dead — stays a duplicate)."""
        if delay <= 0 and not recrawl:
            return self.settle(push=envelopes).pushed
        flags: list[bool] = []
        step = self.settings.batch_size
        for start in range(0, len(envelopes), step):
            out = self._run(
                "push",
                [
                    self._ms(delay, 0),
                    int(recrawl),
                    self._nonce(""),
                    *self._push_args(envelopes[start : start + step]),
                ],
            )
            flags += [c == ord("1") for c in out]
        accepted = sum(flags)
        return PushResult(accepted, len(flags) - accepted, tuple(flags))

    def lease(self, worker: str, n: int, ttl: float | None = None) -> list[Lease]:
        """Hand up to ``n`` ready requests to ``worker`` for ``ttl`` seconds."""
        if n <= 0:
            return []
        sent = time.monotonic()
        raw = self._run("lease", self._lease_args(worker, n, ttl))
        return self._leases(worker, raw, sent)

    def ack(self, leases: Sequence[Lease]) -> int:
        """IN-FLIGHT -> DONE. Stale leases (expired and handed out again) are ignored.
        Returns how many were acked."""
        return self.settle(ack=leases).acked

    def settle(
        self,
        push: Sequence[Envelope] = (),
        ack: Sequence[Lease] = (),
        *,
        lease: tuple[str, int] | None = None,
        ttl: float | None = None,
        free: Sequence[tuple[Lease, str]] = (),
    ) -> Settled:
        """A worker's round trip, atomic and in this order: store ``push`` (deduped), ack
        ``ack``, give back the politeness slots of ``free`` (see :meth:`free`), then
        (``lease=(worker, n)``) lease up to n more. Children are therefore always stored
        before their parent is acknowledged. One script call per ``batch_size`` pushes;
        the acks, frees and the lease ride on the last one."""
        calls = self._settle_calls(push, ack, lease, ttl, free)
        sent = time.monotonic()  # (the lease rides on the last call: sent after this)
        return self._settled(calls, [self._run("settle", args) for args in calls], ack, sent)

    def settle_begin(
        self,
        push: Sequence[Envelope] = (),
        ack: Sequence[Lease] = (),
        *,
        lease: tuple[str, int] | None = None,
        ttl: float | None = None,
        free: Sequence[tuple[Lease, str]] = (),
    ) -> PendingSettle:
        """:meth:`settle`, sent now and read later: the worker goes on with its own work
        while Redis runs the call, and ``.result()`` returns what :meth:`settle` would
        have. Several may be on their way; Redis runs them in the order they were begun
        (on a connection of their own: finish them before a :meth:`settle`, ``nack`` or
        the like whose order matters). A lost connection falls back to retried
        :meth:`settle` calls (a call's nonce makes the retry of a call that did run
        return its outcome)."""
        return PendingSettle(self, self._settle_calls(push, ack, lease, ttl, free), ack)

    def _settle_calls(
        self,
        push: Sequence[Envelope],
        ack: Sequence[Lease],
        lease: tuple[str, int] | None,
        ttl: float | None,
        free: Sequence[tuple[Lease, str]] = (),
    ) -> list[list[Any]]:
        """The settle script calls of one settle: the ARGV of each after the common
        ones."""
        calls: list[list[Any]] = []
        step = self.settings.batch_size
        starts = list(range(0, len(push), step)) or [0]
        for i, start in enumerate(starts):
            chunk = push[start : start + step]
            last = i == len(starts) - 1
            acks = ack if last else ()
            frees = free if last and self.politeness is not None else ()
            want = lease if last and lease is not None else ("", 0)
            if not chunk and not acks and not want[1] and not frees:
                continue
            worker, n, *rest = self._lease_args(want[0], want[1], ttl)
            stamp = self._push_stamp() if chunk else b""
            # (the worker and nonce of the call before it in a pipeline: see PendingSettle)
            args: list[Any] = [
                len(chunk),
                len(acks),
                n,
                worker,
                *rest,
                "",
                "",
                "1" if stamp else "",
                *self._push_args(chunk, stamp),
            ]
            hint, base = self.dedupe.hint, self._fpd  # (the dedupe member and bucket)
            for item in acks:
                args += (hint(item.id, base), item.token)
            for held, outcome in frees:
                args += (held.id, held.token, outcome)
            calls.append(args)
        return calls

    def _settled(
        self,
        calls: Sequence[list[Any]],
        replies: Sequence[Any],
        ack: Sequence[Lease],
        sent: float = 0.0,
    ) -> Settled:
        """The outcome of settle calls from their replies; ``sent``: when the first was
        sent (``time.monotonic()``; 0 if unknown), for the leases' ``granted``."""
        if self.check_vanished and any(works("settle", args) for args in calls):
            self._identity.remember()  # (once) see durability.py
        pushed: list[bool] = []
        acked = 0
        leases: list[Lease] = []
        unacked: tuple[Lease, ...] = ()
        for args, (out_push, out_ack, out_lease, *when) in zip(calls, replies, strict=True):
            pushed += [c == ord("1") for c in out_push]
            flags = bytes(out_ack)
            acked += flags.count(b"1")
            if b"2" in flags:  # the acks ride on the last call: flags align with ack
                unacked = tuple(x for x, f in zip(ack, flags, strict=True) if f == ord("2"))
            if args[2]:
                leases = self._leases(args[3], out_lease, sent, when[0] if when else None)
            elif sent and when:  # (the clocks' offset for push stamps: _push_stamp)
                self._grant_clock.granted(sent, int(when[0]), time.monotonic())
        accepted = sum(pushed)
        return Settled(
            PushResult(accepted, len(pushed) - accepted, tuple(pushed)), acked, leases, unacked
        )

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

    def nack(
        self, lease: Lease, error: str, *, retry: bool = True, delay: float | None = None
    ) -> str:
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

    check_vanished = False
    """Whether :meth:`counts` raises :class:`~redcrawl.errors.CrawlVanished` instead of
    returning finished counts when the crawl's state vanished since this frontier first
    leased from it (:class:`~redcrawl.frontier.durability.CrawlIdentity`; its own
    :meth:`purge` starts it afresh). For workers, which close when the crawl is finished
    (the Scrapy scheduler turns it on); off by default, since a frontier that also reads
    (a tool, a test) would raise after another process's purge."""

    heartbeat_counters: HeartbeatCounters | None = None
    """A worker's counters (e.g. :class:`redcrawl.scrapy.counters.WorkerCounters`), added
    to the crawl with each :meth:`renew` (see :meth:`renew_counting`)."""

    def renew(self, worker: str, ttl: float | None = None) -> None:
        """Heartbeat: ``worker`` and all its leases are alive for ``ttl`` more seconds
        (with :attr:`heartbeat_counters` set, its counters are added in the same call)."""
        if self.heartbeat_counters is not None:
            return self.renew_counting(worker, self.heartbeat_counters, ttl)
        self._run("renew", [worker, self._ms(ttl, self.settings.lease_ttl)])

    def renew_counting(
        self, worker: str, counters: HeartbeatCounters, ttl: float | None = None
    ) -> None:
        """Heartbeat plus ``counters.take()`` in one round trip (a MULTI): the fleet
        totals added to the stats hash, the worker's own totals added to and its gauges
        set in its hash (:meth:`CrawlKeys.worker_counters`), which expires with the
        heartbeat deadline. A call that did not reach Redis gives the counts back for the
        next heartbeat; one that ran (even if a command in it failed) does not."""
        ms = self._ms(ttl, self.settings.lease_ttl)
        totals, mine, gauges = counters.take()
        with redis_errors("renew"):
            pipe = self.client.pipeline(transaction=True)
            self._run("renew", [worker, ms], client=pipe)
            for name, n in totals.items():
                pipe.hincrby(self.keys.stats, name, n)
            own = self.keys.worker_counters(worker)
            for name, n in mine.items():
                pipe.hincrby(own, name, n)
            if gauges:
                pipe.hset(own, mapping=gauges)
            pipe.pexpire(own, ms)
            try:
                replies = pipe.execute(raise_on_error=False)
            except BaseException:
                counters.give_back(totals, mine)
                raise
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply

    def release_worker(self, worker: str) -> int:
        """Give up all of ``worker``'s leases now (force-reclaim / clean shutdown)."""
        n = int(self._run("release_worker", [worker]))
        self.maintain()
        return n

    def disown(self, worker: str, held: Iterable[str]) -> int:
        """Take back now ``worker``'s leases whose tokens are not in ``held`` (to READY, or
        DEAD once their attempts are used up; politeness slots freed), as if they had
        expired with a dead worker's heartbeat. Such orphans come from acks undone by a
        failover to a lagging replica, or lease replies lost on the way: the worker's
        heartbeat would keep them in flight forever (docs/cluster.md, "Durability").
        Call it only when no other call of ``worker`` is on its way (a lease granted by
        a call whose reply has not arrived would be taken back: a repeat, not a loss).
        Returns how many requests were taken back (stats ``orphaned``)."""
        args: list[Any] = [
            worker,
            self.settings.max_attempts,
            self._ms(None, self.settings.lease_ttl),
            *sorted(set(held)),
        ]
        return int(self._run("disown", args))

    def maintain(self) -> tuple[int, int]:
        """Promote due delayed requests and reclaim expired leases.
        Returns (promoted, reclaimed). ``lease`` does this too."""
        promoted, reclaimed = self._run(
            "maintain",
            [self.settings.max_attempts, MAINTAIN_LIMIT, self._ms(None, self.settings.lease_ttl)],
        )
        return int(promoted), int(reclaimed)

    def requeue_dead(self, ids: Sequence[str] | None = None, *, limit: int = 1000) -> int:
        """DEAD -> READY, with a fresh attempt budget: the given ids, or up to ``limit``."""
        if ids is None:
            return int(self._run("requeue_dead", [self._nonce(""), "*", limit]))
        if not ids:
            return 0
        return int(self._run("requeue_dead", [self._nonce(""), "ids", *map(parse_id, ids)]))

    def repair(self) -> list[str]:
        """Check the crawl's counters and layout and repair the corrupt ones (every
        frontier script does this before its first write; :meth:`counts` calls this when
        it reads a corrupt counter). Returns what was repaired, one line each."""
        return [bytes(x).decode(errors="replace") for x in self._run("repair", [])]

    # --- crawl-wide switches -------------------------------------------------------
    def pause(self) -> None:
        """Stop handing out requests (leases held stay valid; pushes still accepted)."""
        with redis_errors("pause"):
            self.client.hset(self.keys.control, "paused", "1")

    def resume(self) -> None:
        with redis_errors("resume"):
            self.client.hdel(self.keys.control, "paused")

    def lost_partitions(self) -> list[int]:
        """The partitions that lost their state (a partitioned crawl's: see
        :class:`~redcrawl.frontier.partitioned.PartitionedFrontier`); none here, a crawl
        of one partition (one that lost its state is gone: a worker's :meth:`counts`
        raises :class:`~redcrawl.errors.CrawlVanished`)."""
        return []

    def accept_loss(self) -> list[int]:
        """Go on without what the lost partitions held (:meth:`lost_partitions`); returns
        them. Nothing to do here."""
        return []

    def is_paused(self) -> bool:
        with redis_errors("is_paused"):
            return bool(self.client.hget(self.keys.control, "paused") == b"1")

    def purge(self) -> None:
        """Delete the crawl's whole frontier state: queues, leases, dead letters, dedupe
        (only the id and token counters stay, so old leases stay stale)."""
        with redis_errors("purge"):
            keys = [*self.keys.all_keys(), *self._extra_keys()]
        keys.remove(self.keys.stats)
        self._scripts.run("purge", [self.keys.stats, *keys], [])
        self._pol_stored = False
        self._identity.forget()
        with redis_errors("purge"):
            self._purge_extra()
            self.done.clear()
            Filter(self.client, self.dedupe, self.keys.fp_seen).clear()

    # --- counters and workers ------------------------------------------------------
    def counts(self, *, repaired: bool = False, check: bool = True) -> Counts:
        """A consistent snapshot of the conservation terms. A corrupt counter is repaired
        first (:meth:`repair`). :class:`~redcrawl.errors.CrawlVanished` instead of finished
        counts when the crawl's state vanished since this frontier worked on it
        (:class:`~redcrawl.frontier.durability.CrawlIdentity`), unless ``check`` is off
        (a partition's counts: its crawl checks, after the sum)."""
        with redis_errors("counts"):
            stored, ready, delayed, dead = self._count_states()
        stats = self._counters(stored, repaired)
        if stats is None:
            return self._repaired_counts(repaired, check)
        accepted, filtered, done, retried, reclaimed, requeued, in_flight = stats
        counts = Counts(
            accepted=accepted,
            filtered=filtered,
            ready=ready,
            delayed=delayed,
            in_flight=in_flight,
            done=done,
            dead=dead,
            retried=retried,
            reclaimed=reclaimed,
            requeued=requeued,
        )
        if counts.finished and self.check_vanished and check:
            self._identity.check()  # a crawl that vanished under this worker is not done
        return counts

    def _counters(self, raw: Sequence[Any], repaired: bool) -> list[int] | None:
        """Stored counters as ints; None if one is corrupt (the caller repairs them and
        reads again), a :class:`FrontierError` if they are still corrupt after a repair."""
        values = [x if isinstance(x, int) else stored_int(x) for x in raw]
        if all(v is not None for v in values):
            return [v for v in values if v is not None]
        if repaired:
            raise FrontierError(
                f"crawl {self.crawl!r}: its counters {list(raw)!r} are corrupt "
                "and could not be repaired; purge the crawl"
            )
        return None

    def _repaired_counts(self, repaired: bool, check: bool = True) -> Counts:
        assert not repaired
        try:
            done = self.repair()
        except FrontierError as exc:  # e.g. a reader with other dedupe settings
            raise FrontierError(
                f"crawl {self.crawl!r} has a corrupt counter, which the next "
                f"call of one of its workers repairs; this process could "
                f"not repair it: {exc}"
            ) from exc
        log.warning(
            "crawl %s: corrupt counters repaired: %s",
            self.crawl,
            "; ".join(done) or "(by another process)",
        )
        return self.counts(repaired=True, check=check)

    _OWN_COUNTERS = frozenset(
        (
            "seq",
            "leases",
            "inflight",
            "accepted",
            "filtered",
            "done",
            "retried",
            "reclaimed",
            "died",
            "requeued",
        )
    )

    def add_stats(self, **deltas: int) -> None:
        """Add to crawl-wide counters outside the state machine (e.g. ``items=3`` from a
        worker's item pipeline), for progress displays."""
        clash = self._OWN_COUNTERS & set(deltas)
        if clash:
            raise FrontierError(
                f"add_stats cannot change the state machine's own counters "
                f"({', '.join(sorted(clash))})"
            )
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
                log.warning(
                    "crawl %s: counter %r holds %r, not an integer: left out", self.crawl, k, v
                )
            else:
                out[k.decode(errors="replace")] = value
        return out

    def workers(self) -> dict[str, float]:
        """Worker id -> heartbeat deadline (seconds since the epoch; 0 for a corrupt one:
        the scripts read it as a stopped heartbeat)."""
        with redis_errors("workers"):
            raw = self.client.hgetall(self.keys.workers)
        return heartbeat_deadlines([raw])

    def forget_worker(self, worker: str) -> None:
        """Remove a worker's heartbeat (it is closing; its leases are already given back)
        and its counters' hash (its last heartbeat added them to the crawl's totals)."""
        with redis_errors("forget_worker"):
            self.client.hdel(self.keys.workers, worker)
            self.client.delete(self.keys.worker_counters(worker))
            self.client.hdel(self.keys.calls, *self.keys.call_fields(worker))
            self._forget_consumers(worker)

    def server_time(self) -> float:
        """The Redis server's clock (seconds since the epoch): the clock of every deadline."""
        with redis_errors("time"):
            sec, usec = self.client.time()
        return float(sec) + float(usec) / 1e6

    # --- inspection ----------------------------------------------------------------
    def _in_flight_as(self, rid: bytes, field: str) -> tuple[bool, str | None, int]:
        """(whether the request ``rid``, not DELAYED or DEAD, is IN-FLIGHT, the worker
        holding it, and what to add to its record's attempts for the delivery in
        progress), from its record's token field ``field``."""
        return bool(field), self._holder(field) if field else None, 0

    def _lease_state_out(self) -> bool:
        """Whether the crawl's records keep no lease state (``FMT.lout`` in
        ``lua/lib.lua``): read from its stored layout."""
        return lease_state_out(stored_layout(self.client.hgetall(self.keys.control)))

    def _envelopes(self, ids: Sequence[bytes]) -> list[Envelope | None]:
        if not ids:
            return []
        return [
            found[2] if found else None
            for found in map(_decoded, self.client.hmget(self.keys.req, list(ids)))
        ]

    def pending(self, limit: int = 100) -> list[PendingInfo]:
        """Ready requests, next to be served first within each tier (streams: ``tier`` 0
        for the high streams, 1 for the low ones)."""
        out: list[PendingInfo] = []
        with redis_errors("pending"):
            for tier, ids in self._ready_ids(limit):
                for rid, env in zip(ids, self._envelopes(ids), strict=True):
                    out.append(
                        PendingInfo(
                            format_id(rid),
                            tier,
                            env.url if env else "?",
                            env.priority if env else 0,
                        )
                    )
                if len(out) >= limit:
                    break
        return out[:limit]

    def inflight(self, limit: int = 100) -> list[InflightInfo]:
        """Leased requests: which worker, since when, until when."""
        out: list[InflightInfo] = []
        with redis_errors("inflight"):
            for batch in self._held(limit):
                recs = self.client.hmget(self.keys.req, [h.id for h in batch]) if batch else []
                for held, rec in zip(batch, recs, strict=True):
                    found = _decoded(rec)
                    if found is None or found[2] is None or not held.holds(found[1]):
                        continue
                    out.append(
                        InflightInfo(
                            format_id(held.id),
                            held.worker,
                            found[0] + held.ended,
                            held.since,
                            held.deadline,
                            found[2].url,
                        )
                    )
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
            found = _decoded(rec)
            attempts = found[0] if found else 0
            url = found[2].url if found and found[2] else "?"
            out.append(
                DeadInfo(
                    format_id(rid), ts / 1000, (e or b"").decode(errors="replace"), attempts, url
                )
            )
        return out

    def describe(self, id: str) -> RequestInfo | None:
        """Where the request ``id`` (as printed by :func:`format_id`) is, or None if it is
        not stored (unknown, or DONE)."""
        rid = parse_id(id)
        k = self.keys
        with redis_errors("describe"):

            def queue(pipe: Any) -> None:
                pipe.hget(k.req, rid)
                pipe.zscore(k.delayed, rid)
                pipe.zscore(k.dead, rid)
                pipe.hget(k.err, rid)

            rec, due, died, err = consistent_read(self.client, queue)
            if rec is None:
                return None
            found = _decoded(rec)
            attempts, token, env = found if found and found[2] else (0, "", None)
            held, worker, ended = (
                self._in_flight_as(rid, token) if died is None and due is None else (False, None, 0)
            )
            attempts += ended
        if env is not None and len(rid) == 20:
            env.fingerprint = rid
        state = (
            "in_flight"
            if held
            else "dead"
            if died is not None
            else "delayed"
            if due is not None
            else "ready"
        )
        return RequestInfo(
            id=format_id(rid),
            state=state,
            attempts=attempts,
            envelope=env,
            worker=worker,
            due=due / 1000 if due is not None else None,
            error=err.decode(errors="replace") if err else None,
        )
