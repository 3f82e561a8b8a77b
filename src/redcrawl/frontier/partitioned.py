# Over 450 lines: every public operation of FrontierCore, routed over the partitions.
"""A crawl split into partitions (``REDCRAWL_PARTITIONS`` > 1): :class:`PartitionedFrontier`
composes one frontier per partition (:class:`~redcrawl.frontier.lists.ListsFrontier` or
:class:`~redcrawl.frontier.streams.StreamsFrontier`, partition ``p`` keyed under the hash
tag ``{<crawl>/<p>}``) and offers the interface of
:class:`~redcrawl.frontier.core.FrontierCore` over all of them, so that the Scrapy
scheduler, the API and the CLI use it unchanged.

- A request's partition is :func:`redcrawl.keys.partition_of` its politeness key (the
  crawl's key mode; ``host`` for a crawl without politeness), so the request, its dedupe
  check, its site's politeness state and its queue share one slot: every script stays
  single-slot, and on a Redis Cluster the partitions spread over the masters.
- A lease carries its partition in its token (``<p>:<token>``); ids without a
  fingerprint (``#<seq>``, numbered per partition) get ``@<p>`` appended, so ids and
  tokens stay unique in the crawl. Acks, nacks, frees, deferrals and releases go to the
  lease's partition.
- A settle that acknowledges requests stores the children first: pushes into other
  partitions go out in one pipelined round, and the acks (with the lease) in a second one
  once every push is stored. Without acks, or when everything is in the acks' one
  partition, a settle is one round.
- Leasing rotates over the partitions by smooth weighted round robin, weighted by each
  partition's ready requests (read with :meth:`counts`, at most every
  :data:`REFRESH_S`, and whenever a lease finds nothing), each partition with ready work
  at least ``1/(4P)`` of the weight, so none starves; a partition with only delayed or
  leased requests is still asked now and then (its due requests and expired leases are
  promoted there).
- Crawl-wide facts are sums over partitions. "Finished" is never true while a partition
  holds work: when every partition reads empty, the partitions are read a second time,
  and the crawl is finished only if none accepted or requeued anything in between (then
  there was an instant at which all were empty at once).
- The crawl's anchor, the keys under ``{<crawl>}``, holds what is crawl-wide and not read
  by scripts: the layout marker ``partitioned/<P> - parts`` (authoritative for P: a
  worker with another ``REDCRAWL_PARTITIONS`` is refused with
  :class:`~redcrawl.errors.LayoutMismatch`, and a one-partition worker's scripts refuse
  the marker too), the ``paused`` flag and the politeness defaults (authoritative; each
  partition's control hash holds the copy its scripts read, written in the same round),
  the lock, the robots.txt cache, the standalone DupeFilter's set and the workers'
  counters.
"""

from __future__ import annotations

import functools
import logging
import math
import secrets
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any, ClassVar, TypeVar, cast

import redis

from redcrawl.codec import Envelope
from redcrawl.dedupe import Filter
from redcrawl.errors import FrontierError, LayoutMismatch, PartitionsLost
from redcrawl.frontier.base import (
    Counts,
    DeadInfo,
    InflightInfo,
    Lease,
    PendingInfo,
    PushResult,
    RequestInfo,
    Settled,
)
from redcrawl.frontier.core import (
    MAINTAIN_LIMIT,
    FrontierCore,
    HeartbeatCounters,
    Held,
    heartbeat_deadlines,
)
from redcrawl.frontier.durability import ReplicaWait
from redcrawl.frontier.lists import ListsFrontier
from redcrawl.frontier.records import stored_int, stored_layout
from redcrawl.frontier.settle import PendingSettle
from redcrawl.frontier.streams import ShardInfo, StreamsFrontier
from redcrawl.keys import CrawlKeys, partition_of
from redcrawl.politeness import KeyMode, politeness_key
from redcrawl.settings import Settings
from redcrawl.transport import redis_errors

__all__ = [
    "LEASE_SHARE",
    "REFRESH_S",
    "PartitionedFrontier",
    "PartitionedLists",
    "PartitionedStreams",
    "anchor_partitions",
    "mismatch",
    "partitioned_class",
]

log = logging.getLogger(__name__)

REFRESH_S = 1.0
"""Seconds a worker leases by its last reading of each partition's ready requests."""
LEASE_SHARE = 64
"""Requests a lease call asks one partition for (when it asks for that many): a lease of
n goes to at most ceil(n / LEASE_SHARE) partitions, so that a call runs few scripts
(each has a fixed cost in Redis); the rotation spreads the calls over the partitions."""
FINISHED_READS = 20
"""Most re-reads of the partitions to confirm that a crawl that reads empty is finished."""
CREATED_FIELD = "parts.id"
"""The crawl's identity as its creation (:meth:`PartitionedFrontier._claim`) stored it in
the anchor's control hash and in every partition's: only a claim and ``accept-loss`` write
it (a worker's ``crawl.id``, :class:`~redcrawl.frontier.durability.CrawlIdentity`, is its
own), so a partition without it, or with another, lost its state since."""
CLAIMED_FIELD = "parts.claimed"
"""Set ("1") in the anchor's control hash once every partition holds
:data:`CREATED_FIELD` (:meth:`PartitionedFrontier.lost_partitions` compares them only
then)."""
MARK = "partitioned/{} - parts"
"""The layout stored in a partitioned crawl's anchor (a one-partition worker's scripts
refuse it: it is no layout of theirs)."""

T = TypeVar("T")


MOST_PARTITIONS = 1024
"""The most partitions a crawl has (``REDCRAWL_PARTITIONS``'s bound)."""


def partitions_left(client: Any, keys: CrawlKeys, below: int = MOST_PARTITIONS) -> list[int]:
    """The partitions ``p < below`` of the crawl ``keys`` names whose control hash exists:
    what a partitioned crawl left when its anchor's master came back empty (one pipelined
    round of EXISTS; on a cluster one per master)."""
    with redis_errors("looking for the crawl's partitions"):
        pipe = client.pipeline(transaction=False)
        for p in range(below):
            pipe.exists(keys.part(p).control)
        return [p for p, found in enumerate(pipe.execute()) if found]


def anchor_lost(crawl: str, left: Sequence[int], n: int | None = None) -> LayoutMismatch:
    """The refusal of a worker (``n``: its ``REDCRAWL_PARTITIONS``, when it is not the
    crawl's) or a tool on a partitioned crawl whose anchor is gone while partitions
    ``left`` remain."""
    shown = ", ".join(map(str, left[:8])) + (", ..." if len(left) > 8 else "")
    worker = (
        f"; this worker has REDCRAWL_PARTITIONS={n}, and its count is not the crawl's"
        if n is not None
        else ""
    )
    return LayoutMismatch(
        f"{LayoutMismatch.PREFIX}: crawl {crawl!r} is partitioned (partitions {shown} hold "
        f"its state) but its anchor is gone (the Redis master holding {{{crawl}}} came back "
        "empty: its layout, paused flag and politeness defaults with it)" + worker + ". "
        "Start its workers with the REDCRAWL_PARTITIONS it was created with (at least "
        f"{max(left, default=0) + 1}): the first stores the anchor again and `redcrawl "
        "status` then reports what was lost; or purge it with that REDCRAWL_PARTITIONS"
    )


def anchor_partitions(control: dict[bytes, bytes]) -> int | None:
    """The partitions of a crawl from its anchor's control hash: P for a partitioned crawl,
    1 for a crawl of one partition, None for a new crawl."""
    raw = stored_layout(control)
    if raw is None:
        return None
    head = raw.split(b" ", 1)[0]
    if head.startswith(b"partitioned/") and head[12:].isdigit():
        return int(head[12:])
    return 1


def mismatch(crawl: str, created: int, mine: int) -> LayoutMismatch:
    return LayoutMismatch(
        f"{LayoutMismatch.PREFIX}: crawl {crawl!r} was created with {created} "
        f"partition{'s' if created > 1 else ''} and this worker uses REDCRAWL_PARTITIONS="
        f"{mine}; give every worker the same REDCRAWL_PARTITIONS (the number a crawl is "
        "created with is fixed), or purge the crawl"
    )


def _wrap_id(p: int, rid: bytes) -> bytes:
    return rid if len(rid) == 20 else rid + b"@%d" % p


def _unwrap_id(rid: bytes) -> bytes:
    return rid if len(rid) == 20 else rid.rsplit(b"@", 1)[0]


def _wrap_text(p: int, text: str) -> str:
    return text if len(text) == 40 and "@" not in text else f"{text}@{p}"


class _SettledNow(PendingSettle):
    """A settle of a partitioned crawl, run at once (:meth:`PartitionedFrontier.settle_begin`)."""

    def __init__(self, outcome: Settled) -> None:  # (not PendingSettle's: nothing queued)
        self.calls = []
        self.ack = ()
        self.replies = []
        self.sent = True
        self.outcome = outcome
        self.error = None

    def result(self) -> Settled:
        assert self.outcome is not None
        return self.outcome


class PartitionedFrontier(FrontierCore):
    """The frontier of a crawl of ``settings.partitions`` partitions (see the module
    docstring); :attr:`parts` are the partitions' own frontiers. Build it with
    :func:`redcrawl.frontier.open_frontier`."""

    PART: ClassVar[type[FrontierCore]]

    def __init__(  # (no FrontierCore.__init__: this frontier has no queue layer of its own)
        self,
        client: redis.Redis,
        settings: Settings,
        crawl: str,
        *,
        clock: Callable[[], int] | None = None,
        partition: int | None = None,
    ) -> None:
        if partition is not None:
            raise FrontierError("a partitioned crawl is not one partition of another")
        if settings.backend != self.BACKEND:
            settings = settings.replace(backend=self.BACKEND)
        self.client = client
        self.settings = settings
        self.crawl = crawl
        self._clock = clock
        self.n = settings.partitions
        self.keys = CrawlKeys(crawl, prefix=settings.key_prefix, tiers=settings.tiers)
        """The crawl's anchor (``{<crawl>}``): see the module docstring."""
        with redis_errors("reading the crawl layout"):
            control = self.client.hgetall(self.keys.control)
        created = anchor_partitions(control)
        if created is not None and created != self.n:
            raise mismatch(crawl, created, self.n)
        self._claimed = created == self.n and CLAIMED_FIELD.encode() in control
        self.parts: list[FrontierCore] = [
            self.PART(client, settings, crawl, clock=clock, partition=p) for p in range(self.n)
        ]
        self.replica_wait = ReplicaWait.of(settings, crawl)
        """One waiter for every partition (its count of short WAITs is the crawl's)."""
        for sub in self.parts:
            sub.replica_wait = self.replica_wait
        first = self.parts[0]
        self.politeness = first.politeness
        self.dedupe = first.dedupe
        self.done: Filter = _PartsFilter([sub.done for sub in self.parts])
        """The partitions' filters of DONE fingerprints as one (a fingerprint is looked
        up in every partition, and added to every one: its partition is its site's, which
        a fingerprint alone does not tell; health checks sample each)."""
        self._pol_stored = False
        self._cluster = getattr(client, "get_node_from_key", None) is not None
        self._ready = [0] * self.n  # ready requests per partition, as last read
        self._live = [True] * self.n  # has delayed or leased requests (asked now and then)
        self._current = [0.0] * self.n  # smooth weighted round robin
        self._read_at = -math.inf
        self._beat_at: dict[str, dict[int, float]] = defaultdict(dict)  # worker -> p -> s
        self._holding: dict[str, Counter[int]] = defaultdict(Counter)
        """Worker -> partition -> leased requests this process handed it and has not seen
        settled: a lease call renews the worker's heartbeat in those partitions too (in a
        crawl of one partition every lease call renews the one heartbeat)."""

    # --- routing -------------------------------------------------------------------
    def partition(self, env: Envelope) -> int:
        """The partition of a request: :func:`~redcrawl.keys.partition_of` its politeness
        key (a request without one, which a crawl with politeness refuses, goes to 0)."""
        slot = env.meta.get("download_slot") if isinstance(env.meta, dict) else None
        mode = cast(KeyMode, self.politeness or "host")
        try:
            key = politeness_key(env.url, slot, mode)
        except (ValueError, TypeError):
            return 0
        return partition_of(key, self.n)

    def _split(self, lease: Lease) -> tuple[int, Lease]:
        """The partition of a lease and the lease as its partition handed it out (a token
        of no partition is left as it is: the partition ignores it as stale)."""
        head, sep, token = lease.token.partition(":")
        if not sep or not head.isdigit() or int(head) >= self.n:
            return 0, lease
        return int(head), replace(lease, id=_unwrap_id(lease.id), token=token)

    def _now(self) -> float:
        """Seconds, on the frontier's clock (the caller's if it gave one)."""
        return time.monotonic() if self._clock is None else self._clock() / 1000

    def _let_go(self, p: int, leases: Sequence[Lease]) -> None:
        """``leases`` of partition ``p`` are settled (acked, nacked, released, deferred)."""
        for x in leases:
            held = self._holding[x.worker]
            held[p] -= 1
            if held[p] <= 0:
                del held[p]

    def _wrap(self, p: int, leases: Sequence[Lease]) -> list[Lease]:
        return [replace(x, id=_wrap_id(p, x.id), token=f"{p}:{x.token}") for x in leases]

    def _group(self, items: Sequence[T], part: Callable[[T], int]) -> dict[int, list[int]]:
        """Indexes of ``items`` by partition."""
        out: dict[int, list[int]] = defaultdict(list)
        for i, item in enumerate(items):
            out[part(item)].append(i)
        return out

    def _by_lease(self, leases: Sequence[Lease]) -> dict[int, list[Lease]]:
        out: dict[int, list[Lease]] = defaultdict(list)
        for lease in leases:
            p, own = self._split(lease)
            out[p].append(own)
        return out

    def _route_id(self, text: str) -> tuple[list[int], str]:
        """The partitions that may hold the request ``text`` (an id as printed): the one
        its ``@<p>`` names, else every one (a fingerprint: its partition is its site's)."""
        head, sep, p = text.rpartition("@")
        if sep and p.isdigit() and int(p) < self.n:
            return [int(p)], head
        return list(range(self.n)), text

    # --- creation and the layout ---------------------------------------------------
    def _claim(self) -> None:
        """Before the first write: mark the anchor (or find it marked with this P) and
        create every partition's layout in one round, so that all agree."""
        if self._claimed:
            return
        mark = MARK.format(self.n)
        with redis_errors("creating the partitioned crawl"):
            anchored = self.client.hexists(self.keys.control, "layout")
        if not anchored:
            self._check_count()
        with redis_errors("creating the partitioned crawl"):
            pipe = self.client.pipeline(transaction=True)  # (one slot: the anchor's)
            pipe.hsetnx(self.keys.control, "layout", mark)
            pipe.hsetnx(self.keys.control, "layout.copy", mark)
            pipe.hsetnx(self.keys.stats, "partitions", self.n)
            pipe.hsetnx(self.keys.control, CREATED_FIELD, f"{secrets.token_hex(8)}/{self.n}")
            pipe.hgetall(self.keys.control)
            control = pipe.execute()[-1]
        created = anchor_partitions(control)
        if created != self.n:
            raise mismatch(self.crawl, created or 1, self.n)
        if CLAIMED_FIELD.encode() in control:
            self._claimed = True  # (another process completed the claim)
            return
        paused = control.get(b"paused") == b"1"
        token, give = self._crawl_token(control[CREATED_FIELD.encode()])
        args = [
            self.settings.max_attempts,
            MAINTAIN_LIMIT,
            self.parts[0]._ms(None, self.settings.lease_ttl),
        ]
        replies = self._round(
            [(p, self._call(p, "maintain", args)) for p in range(self.n)],
            "creating the partitioned crawl",
        )
        for reply in replies:
            if isinstance(reply, Exception):
                with redis_errors("creating the partitioned crawl"):
                    raise reply
        if paused:
            self._each_control(lambda pipe, key: pipe.hset(key, "paused", "1"))
        if give:  # (every partition's reply before the anchor says claimed: a cluster
            with redis_errors("creating the partitioned crawl"):  # orders no pipeline)
                pipe = self.client.pipeline(transaction=False)
                for sub in self.parts:
                    pipe.hsetnx(sub.keys.control, CREATED_FIELD, token)
                pipe.execute()
        with redis_errors("creating the partitioned crawl"):
            self.client.hset(self.keys.control, mapping={CREATED_FIELD: token, CLAIMED_FIELD: 1})
        self._claimed = True

    def _check_count(self) -> None:
        """Before a new anchor is stored: :class:`LayoutMismatch` if partitions of the
        crawl remain (its anchor was lost) whose count is not this worker's: their
        identity says it (``<token>/<P>``), or a partition at or past P exists."""
        with redis_errors("creating the partitioned crawl"):
            pipe = self.client.pipeline(transaction=False)
            for sub in self.parts:
                pipe.hget(sub.keys.control, CREATED_FIELD)
            if self.n < MOST_PARTITIONS:
                pipe.exists(self.keys.part(self.n).control)
            replies = pipe.execute()
        counts = {x.rpartition(b"/")[2] for x in replies[: self.n] if x and b"/" in x}
        beyond = any(replies[self.n :])
        if beyond or counts - {str(self.n).encode()}:
            raise anchor_lost(self.crawl, partitions_left(self.client, self.keys), self.n)

    def _crawl_token(self, anchor_id: bytes) -> tuple[bytes, bool]:
        """The crawl's identity (:data:`CREATED_FIELD`), and whether the partitions are
        given it now (``anchor_id``: the anchor's, stored by this claim or by another
        process's).

        - A new crawl, or one created before partitions held the crawl's identity (no
          partition holds one), or a claim another process began (they hold the
          anchor's only): the anchor's, True.
        - The anchor's state was lost (partitions hold an identity that is not the
          anchor's): theirs, False (a partition without it lost its state too)."""
        with redis_errors("creating the partitioned crawl"):
            pipe = self.client.pipeline(transaction=False)
            for sub in self.parts:
                pipe.hget(sub.keys.control, CREATED_FIELD)
            held = Counter(x for x in pipe.execute() if x is not None)
        if not held or set(held) == {anchor_id}:
            return anchor_id, True
        (common, _n), *_ = held.most_common(1)
        log.warning(
            "crawl %r: its anchor (layout, paused flag, politeness defaults, robots.txt "
            "cache) lost its state and was stored again; its partitions hold the crawl",
            self.crawl,
        )
        return common, False

    @staticmethod
    def _count(sub: FrontierCore) -> Callable[[Any], Any]:
        keys, args = sub._count_call()
        return lambda pipe: sub._scripts.run("counts", keys, args, client=pipe)

    def _call(self, p: int, script: str, args: list[Any]) -> Callable[[Any], Any]:
        """Script ``script`` of partition ``p`` with ``args``, queued on a pipeline."""
        return functools.partial(self.parts[p]._run, script, args)

    def _round(
        self,
        calls: Sequence[tuple[int, Callable[[Any], Any]]],
        what: str,
        *,
        transaction: bool = False,
    ) -> list[Any]:
        """One pipelined round (one per node on a cluster): each call queues its commands
        on the pipeline; returns the replies, errors as exception objects."""
        if not calls:
            return []
        with redis_errors(what):
            pipe = self.client.pipeline(transaction=transaction)
            for _p, queue in calls:
                queue(pipe)  # (each call: queue(pipe), a pipeline as the client)
            waits = self._waits(pipe, [p for p, _ in calls]) if what == "settle" else []
            replies = list(pipe.execute(raise_on_error=False))
        for i, (_p, queue) in enumerate(calls):
            if isinstance(replies[i], redis.exceptions.NoScriptError):
                # it did not run: a failover moved its slot to a server without the
                # scripts (the pipeline followed the MOVED with EVALSHA). Alone, the call
                # loads its script where it runs (and waits for its replicas there).
                try:
                    replies[i] = queue(None)
                except Exception as exc:  # (a round's replies: errors as objects)
                    replies[i] = exc
        if waits:
            wait = self.replica_wait
            assert wait is not None
            for key, acked in zip(waits, replies[-len(waits) :], strict=True):
                if isinstance(acked, redis.exceptions.ResponseError) and "replica" in str(acked):
                    # the slot map was out of date (a planned failover): the calls followed
                    # MOVED to the new master, the WAIT went to the old one. Asked again
                    # where the calls ran (the map is up to date now), on the connection
                    # they used (the pool gives the last one back first).
                    try:
                        acked = self.client.execute_command(
                            *wait.command(), **wait.options(self.client, key)
                        )
                    except redis.exceptions.RedisError as exc:
                        acked = exc
                wait.account(acked)
            del replies[-len(waits) :]
        return replies

    def _waits(self, pipe: Any, touched: Sequence[int]) -> list[str]:
        """With ``REDCRAWL_WAIT_REPLICAS``: a WAIT queued on ``pipe`` for each node (each
        partition's master on a cluster, the server otherwise) the round's settle calls
        went to; a key of each, in order."""
        wait = self.replica_wait
        if wait is None:
            return []
        node_of = getattr(self.client, "get_node_from_key", None)
        nodes: dict[Any, str] = {}
        for p in touched:
            key = self.parts[p].keys.control
            nodes.setdefault(node_of(key).name if node_of else "", key)
        for key in nodes.values():
            pipe.execute_command(*wait.command(), **wait.options(self.client, key))
        return list(nodes.values())

    def _each_control(self, command: Callable[[Any, str], Any]) -> None:
        with redis_errors("changing the crawl's switches"):
            pipe = self.client.pipeline(transaction=False)
            command(pipe, self.keys.control)
            for sub in self.parts:
                command(pipe, sub.keys.control)
            pipe.execute()

    # --- transitions ---------------------------------------------------------------
    def push(
        self, envelopes: Sequence[Envelope], *, delay: float = 0.0, recrawl: bool = False
    ) -> PushResult:
        if delay <= 0 and not recrawl:
            return self.settle(push=envelopes).pushed
        self._claim()
        flags = [False] * len(envelopes)
        for p, idx in self._group(envelopes, self.partition).items():
            got = self.parts[p].push([envelopes[i] for i in idx], delay=delay, recrawl=recrawl)
            for i, flag in zip(idx, got.flags, strict=True):
                flags[i] = flag
            self._live[p] = True
        accepted = sum(flags)
        return PushResult(accepted, len(flags) - accepted, tuple(flags))

    def lease(self, worker: str, n: int, ttl: float | None = None) -> list[Lease]:
        if n <= 0:
            return []
        return self.settle(lease=(worker, n), ttl=ttl).leases

    def ack(self, leases: Sequence[Lease]) -> int:
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
        """:meth:`FrontierCore.settle` over the partitions: the pushes stored before any
        ack (in a round of their own when they go to another partition than the acks),
        the lease spread over the partitions by their ready work."""
        self._claim()
        pushes = self._group(push, self.partition)
        acks = self._by_lease(ack)
        frees: dict[int, list[tuple[Lease, str]]] = defaultdict(list)
        for held, outcome in free:
            p, own = self._split(held)
            frees[p].append((own, outcome))
        worker, n = lease if lease is not None else ("", 0)
        plan = self._plan(n) if n > 0 else {}
        touched = sorted(set(pushes) | set(acks) | set(frees) | set(plan))
        single = next(iter(acks)) if len(acks) == 1 else None
        first: list[tuple[int, list[Any]]] = []  # (partition, settle call) stored first
        second: list[tuple[int, list[Any]]] = []  # then those that ack
        for p in touched:
            sub = self.parts[p]
            envs = [push[i] for i in pushes.get(p, ())]
            want = (worker, plan[p]) if p in plan else None
            if p in acks and p != single and envs:  # its pushes must precede others' acks
                calls = sub._settle_calls(envs, (), None, ttl)
                calls += sub._settle_calls((), acks[p], want, ttl, frees.get(p, ()))
            else:
                calls = sub._settle_calls(envs, acks.get(p, ()), want, ttl, frees.get(p, ()))
            for args in calls:
                (second if args[1] else first).append((p, args))
        if not acks:
            first, second = [], first
        # a lease renews the worker's heartbeat where it leases: and where it holds leases
        ms = self.parts[0]._ms(ttl, self.settings.lease_ttl)
        now, beat_at = self._now(), self._beat_at[worker]
        beats = [
            (p, self._call(p, "renew", [worker, ms]))
            for p, held in self._holding[worker].items()
            if n > 0 and held > 0 and p not in plan and now - beat_at.get(p, 0.0) > ms / 3000
        ]
        for p in [*plan, *(p for p, _ in beats)]:
            beat_at[p] = now
        done: dict[int, list[tuple[list[Any], Any]]] = defaultdict(list)
        sent = time.monotonic()  # (the leases' granted: their calls went out after this)
        for batch, extra in ((first, []), (second, beats)):
            queued = [(p, self._call(p, "settle", a)) for p, a in batch]
            replies = self._round([*queued, *extra], "settle")
            for (p, args), reply in zip(batch, replies[: len(batch)], strict=True):
                done[p].append((args, reply))
            self._raise_first(done, replies[len(batch) :])
        for p, mine in acks.items():
            self._let_go(p, mine)
        leases = self._outcome(done, push, pushes, ack, acks, sent)
        if n > 0 and not leases.leases:
            leases = self._lease_again(worker, n, ttl, set(plan), leases)
        return leases

    def _raise_first(
        self, done: dict[int, list[tuple[list[Any], Any]]], more: Sequence[Any] = ()
    ) -> None:
        """Raise the first refusal of a round, after giving back what the round's other
        calls leased (a retry leases again: nothing may stay held by a live worker)."""
        errors = [r for calls in done.values() for _a, r in calls if isinstance(r, Exception)]
        errors += [r for r in more if isinstance(r, Exception)]
        if not errors:
            return
        for p, calls in done.items():
            for args, reply in calls:
                if not isinstance(reply, Exception) and args[2]:
                    got = self.parts[p]._leases(args[3], reply[2])
                    try:
                        self.parts[p].release(got)
                    except FrontierError:
                        log.warning("crawl %s: could not give back %d leases", self.crawl, len(got))
        with redis_errors("settle"):
            raise errors[0]

    def _outcome(
        self,
        done: dict[int, list[tuple[list[Any], Any]]],
        push: Sequence[Envelope],
        pushes: dict[int, list[int]],
        ack: Sequence[Lease],
        acks: dict[int, list[Lease]],
        sent: float = 0.0,
    ) -> Settled:
        flags = [False] * len(push)
        acked = 0
        leases: list[Lease] = []
        unacked: list[Lease] = []
        for p, calls in done.items():
            out = self.parts[p]._settled(
                [a for a, _ in calls], [r for _, r in calls], acks.get(p, ()), sent
            )
            for i, flag in zip(pushes.get(p, ()), out.pushed.flags, strict=True):
                flags[i] = flag
            acked += out.acked
            got = self._wrap(p, out.leases)
            leases += got
            for x in got:
                self._holding[x.worker][p] += 1
            unacked += self._wrap(p, out.unacked)
            self._ready[p] = max(self._ready[p] + out.pushed.accepted - len(got), 0)
            if any(args[2] and len(out.leases) < args[2] for args, _ in calls):
                self._ready[p] = 0  # asked for more than it had (or its sites are closed)
            if out.pushed.accepted or got:
                self._live[p] = True
        if unacked:  # (the caller's own lease objects)
            mine = {(x.id, x.token) for x in unacked}
            unacked = [x for x in ack if (x.id, x.token) in mine]
        accepted = sum(flags)
        return Settled(
            PushResult(accepted, len(flags) - accepted, tuple(flags)), acked, leases, tuple(unacked)
        )

    def _lease_again(
        self, worker: str, n: int, ttl: float | None, asked: set[int], first: Settled
    ) -> Settled:
        """A lease found nothing: read the partitions again and ask those not yet asked
        that have work."""
        self._part_counts()
        plan = self._plan(n, asked)
        if not plan:
            return first
        calls = [
            (p, self.parts[p]._settle_calls((), (), (worker, k), ttl)[0]) for p, k in plan.items()
        ]
        sent = time.monotonic()
        replies = self._round([(p, self._call(p, "settle", a)) for p, a in calls], "lease")
        done: dict[int, list[tuple[list[Any], Any]]] = defaultdict(list)
        for (p, args), reply in zip(calls, replies, strict=True):
            done[p].append((args, reply))
        self._raise_first(done)
        again = self._outcome(done, (), {}, (), {}, sent)
        return Settled(first.pushed, first.acked, again.leases, first.unacked)

    def _plan(self, n: int, skip: set[int] | None = None) -> dict[int, int]:
        """How many of ``n`` requests to ask each partition for: smooth weighted round
        robin over the partitions' ready requests (each with work at least 1/(4P) of the
        weight; one with only delayed or leased requests a weight of 1), one pick per
        :data:`LEASE_SHARE` requests; none to the partitions in ``skip``)."""
        if time.monotonic() - self._read_at > REFRESH_S:
            self._part_counts()
        total = sum(self._ready)
        floor = max(1, total // (4 * self.n))
        weights = [
            0 if skip and p in skip else max(r, floor) if r > 0 else (1 if live else 0)
            for p, (r, live) in enumerate(zip(self._ready, self._live, strict=True))
        ]
        whole = sum(weights)
        if whole == 0:
            return {}
        plan: dict[int, int] = defaultdict(int)
        chunks = -(-n // LEASE_SHARE)
        for c in range(chunks):
            for p, w in enumerate(weights):
                self._current[p] += w
            best = max(range(self.n), key=self._current.__getitem__)
            self._current[best] -= whole
            plan[best] += n // chunks + (1 if c < n % chunks else 0)
        return dict(plan)

    def settle_begin(
        self,
        push: Sequence[Envelope] = (),
        ack: Sequence[Lease] = (),
        *,
        lease: tuple[str, int] | None = None,
        ttl: float | None = None,
        free: Sequence[tuple[Lease, str]] = (),
    ) -> PendingSettle:
        """:meth:`settle`, run now (a partitioned crawl does not pipeline settles across
        calls yet): ``.result()`` returns its outcome."""
        return _SettledNow(self.settle(push, ack, lease=lease, ttl=ttl, free=free))

    def release(self, leases: Sequence[Lease]) -> int:
        out = 0
        for p, own in self._by_lease(leases).items():
            out += self.parts[p].release(own)
            self._let_go(p, own)
        return out

    def nack(
        self, lease: Lease, error: str, *, retry: bool = True, delay: float | None = None
    ) -> str:
        p, own = self._split(lease)
        self._live[p] = True
        outcome = self.parts[p].nack(own, error, retry=retry, delay=delay)
        self._let_go(p, [own])
        return outcome

    def dead_letter(self, lease: Lease, error: str) -> str:
        return self.nack(lease, error, retry=False)

    heartbeat_counters: HeartbeatCounters | None = None

    def renew(self, worker: str, ttl: float | None = None) -> None:
        """Heartbeat: ``worker`` and its leases in every partition live ``ttl`` more
        seconds, in one pipelined round (with :attr:`heartbeat_counters`: its counters
        added in the same round, the fleet totals to partition 0's stats, its own to the
        anchor's :meth:`~redcrawl.keys.CrawlKeys.worker_counters`)."""
        ms = self.parts[0]._ms(ttl, self.settings.lease_ttl)
        counters = self.heartbeat_counters
        totals, mine, gauges = counters.take() if counters is not None else ({}, {}, {})
        try:
            with redis_errors("renew"):
                pipe = self.client.pipeline(transaction=not self._cluster)
                for sub in self.parts:
                    sub._run("renew", [worker, ms], client=pipe)
                if counters is not None:
                    for name, k in totals.items():
                        pipe.hincrby(self.parts[0].keys.stats, name, k)
                    own = self.keys.worker_counters(worker)
                    for name, k in mine.items():
                        pipe.hincrby(own, name, k)
                    if gauges:
                        pipe.hset(own, mapping=gauges)
                    pipe.pexpire(own, ms)
                replies = pipe.execute(raise_on_error=False)
        except BaseException:
            if counters is not None:
                counters.give_back(totals, mine)
            raise
        for i, reply in enumerate(replies):
            if i < len(self.parts) and isinstance(reply, redis.exceptions.NoScriptError):
                # it did not run: a failover moved the partition's slot to a server without
                # the scripts (as in _round). Alone, the renew loads its script there.
                self.parts[i]._run("renew", [worker, ms])
            elif isinstance(reply, Exception):
                with redis_errors("renew"):
                    raise reply
        self._beat_at[worker] = dict.fromkeys(range(self.n), self._now())

    def renew_counting(
        self, worker: str, counters: HeartbeatCounters, ttl: float | None = None
    ) -> None:
        own, self.heartbeat_counters = self.heartbeat_counters, counters
        try:
            self.renew(worker, ttl)
        finally:
            self.heartbeat_counters = own

    def release_worker(self, worker: str) -> int:
        self._holding.pop(worker, None)
        return sum(sub.release_worker(worker) for sub in self.parts)

    def disown(self, worker: str, held: Iterable[str]) -> int:
        """Each partition takes back ``worker``'s leases there not in ``held`` (tokens
        ``<p>:<token>``; one of no partition names nothing)."""
        per: list[list[str]] = [[] for _ in self.parts]
        for token in held:
            head, sep, tok = token.partition(":")
            if sep and head.isdigit() and int(head) < self.n:
                per[int(head)].append(tok)
        return sum(sub.disown(worker, per[p]) for p, sub in enumerate(self.parts))

    def maintain(self) -> tuple[int, int]:
        self._claim()
        promoted = reclaimed = 0
        for sub in self.parts:
            a, b = sub.maintain()
            promoted, reclaimed = promoted + a, reclaimed + b
        return promoted, reclaimed

    def requeue_dead(self, ids: Sequence[str] | None = None, *, limit: int = 1000) -> int:
        if ids is None:
            total = 0
            for sub in self.parts:
                if total >= limit:
                    break
                total += sub.requeue_dead(limit=limit - total)
            return total
        routed: dict[int, list[str]] = defaultdict(list)
        for text in ids:
            parts, own = self._route_id(text)
            for p in parts:
                routed[p].append(own)
        return sum(self.parts[p].requeue_dead(own) for p, own in routed.items())

    def repair(self) -> list[str]:
        return [
            f"partition {p}: {line}" for p, sub in enumerate(self.parts) for line in sub.repair()
        ]

    # --- crawl-wide switches -------------------------------------------------------
    def pause(self) -> None:
        """Stop handing out requests in every partition (the anchor's flag is the crawl's;
        each partition's is the copy its scripts read)."""
        self._each_control(lambda pipe, key: pipe.hset(key, "paused", "1"))

    def resume(self) -> None:
        self._each_control(lambda pipe, key: pipe.hdel(key, "paused"))

    def is_paused(self) -> bool:
        with redis_errors("is_paused"):
            return bool(self.client.hget(self.keys.control, "paused") == b"1")

    def purge(self) -> None:
        """Every partition's state, then the anchor's (its layout marker included: the
        crawl may then be created again with another P)."""
        with redis_errors("purge"):  # (first: no partition is reported lost meanwhile)
            self.client.hdel(self.keys.control, CLAIMED_FIELD)
        for sub in self.parts:
            sub.purge()
        with redis_errors("purge"):
            self.client.unlink(*self.keys.all_keys())
            Filter(self.client, self.dedupe, self.keys.fp_seen).clear()
            # a claim by another process meanwhile gave purged partitions the old identity
            # (the anchor still held it): the crawl created anew would take it for its own
            pipe = self.client.pipeline(transaction=False)
            for sub in self.parts:
                pipe.hdel(sub.keys.control, CREATED_FIELD)
            pipe.execute()
        self._claimed = False
        self._pol_stored = False
        self._ready = [0] * self.n

    # --- counters and workers ------------------------------------------------------
    def _part_counts(self) -> list[Counts]:
        """Each partition's counts, each one consistent snapshot (its ``counts`` script),
        read in one pipelined round (one per node; on one server a MULTI: one snapshot of
        the whole crawl); the lease weights are updated from them."""
        replies = self._round(
            [(p, self._count(sub)) for p, sub in enumerate(self.parts)],
            "counts",
            transaction=not self._cluster,
        )
        out = [_counts_of(sub, reply) for sub, reply in zip(self.parts, replies, strict=True)]
        self._ready = [c.ready for c in out]
        self._live = [c.delayed + c.in_flight > 0 for c in out]
        self._read_at = time.monotonic()
        return out

    def counts(self, *, repaired: bool = False, check: bool = True) -> Counts:
        """The sums of the partitions' counts. When every partition reads empty, they
        are read again until two reads in a row agree that none accepted or requeued
        anything in between (see the module docstring): "finished" is never true while a
        partition holds work. ``check``: as :meth:`FrontierCore.counts`."""
        parts = self._part_counts()
        for _ in range(FINISHED_READS if self._cluster else 0):  # (one server: one MULTI)
            if any(c.pending for c in parts):
                break
            again = self._part_counts()
            if all(
                (a.accepted, a.requeued, a.pending) == (b.accepted, b.requeued, 0)
                for a, b in zip(parts, again, strict=True)
            ):
                parts = again
                break
            parts = again
        counts = _sum_counts(parts)
        if counts.finished and self.check_vanished and check:
            lost = self.lost_partitions()  # (first: its message says what to do)
            if lost:
                raise PartitionsLost(self.crawl, lost, self.n)
            for sub in self.parts:  # a partition whose master came back empty
                sub._identity.check()
        return counts

    def lost_partitions(self) -> list[int]:
        """The partitions that lost their state since the crawl was created (their
        control hash lacks the crawl's identity, or holds another: stored again by a
        worker's call after its master came back empty). None while the crawl is being
        created or purged, nor for one made by an older redcrawl until a process of this
        one writes to it.
        (The anchor is read first: partitions read after it say "claimed" hold what the
        claim gave them, on a cluster too.)"""
        with redis_errors("reading the partitions' identities"):
            crawl_id, claimed = self.client.hmget(self.keys.control, [CREATED_FIELD, CLAIMED_FIELD])
            if claimed != b"1":
                return []
            pipe = self.client.pipeline(transaction=False)
            for sub in self.parts:
                pipe.hget(sub.keys.control, CREATED_FIELD)
            held = pipe.execute()
        return [p for p, found in enumerate(held) if found != crawl_id]

    def accept_loss(self) -> list[int]:
        """The crawl goes on without what its lost partitions held: they get the crawl's
        identity again (what they hold now is kept). Returns the partitions accepted."""
        lost = self.lost_partitions()
        if lost:
            with redis_errors("accepting the lost partitions"):
                crawl_id = self.client.hget(self.keys.control, CREATED_FIELD)
                pipe = self.client.pipeline(transaction=False)
                for p in lost:
                    pipe.hset(self.parts[p].keys.control, CREATED_FIELD, crawl_id)
                pipe.execute()
        return lost

    @property
    def check_vanished(self) -> bool:  # (FrontierCore's is a class attribute)
        return self.parts[0].check_vanished

    @check_vanished.setter
    def check_vanished(self, on: bool) -> None:
        for sub in self.parts:  # each remembers its partition's identity when it works
            sub.check_vanished = on

    def _hashes(self, key: Callable[[CrawlKeys], str], what: str) -> list[dict[bytes, bytes]]:
        """HGETALL of ``key`` of every partition: one pipelined round (one per node)."""
        with redis_errors(what):
            pipe = self.client.pipeline(transaction=False)
            for sub in self.parts:
                pipe.hgetall(key(sub.keys))
            return list(pipe.execute())

    def stats(self) -> dict[str, int]:
        """The sums of the partitions' counters (the heartbeat counters are partition
        0's), read in one pipelined round."""
        out: dict[str, int] = defaultdict(int)
        for raw in self._hashes(lambda k: k.stats, "stats"):
            for name, value in raw.items():
                number = stored_int(value)
                if number is None:
                    log.warning(
                        "crawl %s: counter %r holds %r, not an integer: left out",
                        self.crawl,
                        name,
                        value,
                    )
                    continue
                out[name.decode(errors="replace")] += number
        return dict(out)

    def add_stats(self, **deltas: int) -> None:
        """Added to partition 0's counters (crawl-wide counters are sums over partitions)."""
        self.parts[0].add_stats(**deltas)

    def workers(self) -> dict[str, float]:
        """Each worker's latest heartbeat deadline over the partitions (one round)."""
        return heartbeat_deadlines(self._hashes(lambda k: k.workers, "workers"))

    def forget_worker(self, worker: str) -> None:
        for sub in self.parts:
            sub.forget_worker(worker)
        with redis_errors("forget_worker"):
            self.client.delete(self.keys.worker_counters(worker))

    def server_time(self) -> float:
        return self.parts[0].server_time()

    # --- politeness ------------------------------------------------------------------
    def drop_legacy_auto_delay(self, *, batch: int = 500) -> int:
        """Each partition's (a partitioned crawl is newer than the legacy field, so this
        finds nothing unless someone wrote one by hand)."""
        return sum(sub.drop_legacy_auto_delay(batch=batch) for sub in self.parts)

    def store_politeness(self, *, worker: bool = False) -> None:
        """Every partition's copy, then the anchor's (the authoritative one, read by
        tools) from partition 0's."""
        for sub in self.parts:
            sub.store_politeness(worker=worker)
        self._pol_stored = True
        with redis_errors("storing the crawl's politeness settings"):
            stored = self.client.hget(self.parts[0].keys.control, "politeness")
            if stored is not None:
                self.client.hset(self.keys.control, "politeness", stored)

    def free(self, items: Sequence[tuple[Lease, str]]) -> int:
        routed: dict[int, list[tuple[Lease, str]]] = defaultdict(list)
        for held, outcome in items:
            p, own = self._split(held)
            routed[p].append((own, outcome))
        return sum(self.parts[p].free(group) for p, group in routed.items())

    def charge_fetch(self, keys: Sequence[str]) -> None:
        routed: dict[int, list[str]] = defaultdict(list)
        for key in keys:
            routed[partition_of(key, self.n)].append(key)
        for p, group in routed.items():
            self.parts[p].charge_fetch(group)

    def block_site(self, key: str, retry_after: float | None) -> None:
        self.parts[partition_of(key, self.n)].block_site(key, retry_after)

    def start_late(self, leases: Sequence[Lease]) -> list[bool]:
        out = [True] * len(leases)
        split = [self._split(x) for x in leases]
        for p, idx in self._group(split, lambda x: x[0]).items():
            flags = self.parts[p].start_late([split[i][1] for i in idx])
            for i, flag in zip(idx, flags, strict=True):
                out[i] = flag
        return out

    def retry_start(
        self, leases: Sequence[Lease], check: Sequence[bool] = ()
    ) -> list[float | None]:
        out: list[float | None] = [None] * len(leases)
        split = [self._split(x) for x in leases]
        checks = [i < len(check) and check[i] for i in range(len(leases))]
        for p, idx in self._group(split, lambda x: x[0]).items():
            waits = self.parts[p].retry_start([split[i][1] for i in idx], [checks[i] for i in idx])
            for i, wait in zip(idx, waits, strict=True):
                out[i] = wait
        return out

    def defer(self, lease: Lease, reason: str, *, retry_after: float | None = None) -> str:
        p, own = self._split(lease)
        outcome = self.parts[p].defer(own, reason, retry_after=retry_after)
        self._let_go(p, [own])
        return outcome

    def politeness_stats(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for sub in self.parts:
            for name, value in sub.politeness_stats().items():
                out[name] += value
        return dict(out)

    def next_open(self) -> float | None:
        """The first time a politeness key with ready work opens in any partition (see
        :meth:`FrontierCore.next_open`), read in one pipelined round."""
        if self.politeness is None:
            return None
        with redis_errors("next_open"):
            pipe = self.client.pipeline(transaction=False)
            pipe.time()
            for sub in self.parts:
                for t in range(sub.keys.tiers):
                    pipe.zrange(sub.keys.open(t), 0, 0, withscores=True)
            (sec, usec), *heads = pipe.execute()
        now = sec * 1000 + usec / 1000 if self._clock is None else self._clock()
        scores = [h[0][1] for h in heads if h and h[0][1] < 2**52]
        return max(min(scores) - now, 0.0) / 1000 if scores else None

    # --- inspection ----------------------------------------------------------------
    def pending(self, limit: int = 100) -> list[PendingInfo]:
        out: list[PendingInfo] = []
        for p, sub in enumerate(self.parts):
            if len(out) >= limit:
                break
            out += [replace(x, id=_wrap_text(p, x.id)) for x in sub.pending(limit - len(out))]
        return out

    def inflight(self, limit: int = 100) -> list[InflightInfo]:
        out: list[InflightInfo] = []
        for p, sub in enumerate(self.parts):
            if len(out) >= limit:
                break
            out += [replace(x, id=_wrap_text(p, x.id)) for x in sub.inflight(limit - len(out))]
        return out

    def dead(self, limit: int = 100) -> list[DeadInfo]:
        out: list[DeadInfo] = []
        for p, sub in enumerate(self.parts):
            out += [replace(x, id=_wrap_text(p, x.id)) for x in sub.dead(limit)]
        return sorted(out, key=lambda x: x.died_at)[:limit]

    def describe(self, id: str) -> RequestInfo | None:
        parts, own = self._route_id(id)
        for p in parts:
            found = self.parts[p].describe(own)
            if found is not None:
                return replace(found, id=_wrap_text(p, found.id))
        return None

    # --- no queue layer of its own (its partitions have one each) --------------------
    def _script_keys(self) -> list[str]:
        raise NotImplementedError("a partitioned crawl's scripts run in its partitions")

    def _layout(self) -> str:
        raise NotImplementedError("a partitioned crawl's layout is its partitions'")

    def _push_extra(self, envelopes: Sequence[Envelope]) -> None:
        raise NotImplementedError("a partitioned crawl pushes into its partitions")

    def _count_states(self) -> tuple[Sequence[Any], int, int, int]:
        raise NotImplementedError("a partitioned crawl counts its partitions")

    def _count_call(self) -> tuple[list[str], list[Any]]:
        raise NotImplementedError("a partitioned crawl counts its partitions")

    def _ready_ids(self, limit: int) -> Iterator[tuple[int, list[bytes]]]:
        raise NotImplementedError("a partitioned crawl's queues are its partitions'")

    def _held(self, limit: int) -> Iterator[list[Held]]:
        raise NotImplementedError("a partitioned crawl's leases are its partitions'")

    def _holder(self, token: str) -> str | None:
        raise NotImplementedError("a partitioned crawl's leases are its partitions'")

    def _extra_keys(self) -> list[str]:
        raise NotImplementedError("a partitioned crawl's keys are its partitions'")

    def _forget_consumers(self, worker: str) -> None:
        raise NotImplementedError("a partitioned crawl's consumers are its partitions'")


def _counts_of(sub: FrontierCore, reply: Any) -> Counts:
    """A partition's counts from its ``counts`` script's reply; read again the ordinary
    way (which repairs a corrupt counter, or raises) if the reply is an error or holds a
    corrupt counter."""
    if isinstance(reply, Exception):  # (the crawl's counts check for lost state, after)
        return sub.counts(check=False)
    values = sub._counters(reply[:7], False)
    ready = reply[7] if isinstance(reply[7], int) else stored_int(reply[7])
    if ready is not None and len(reply) > 10 and sub.politeness is not None:
        # streams with politeness: + the requests waiting in the per-key queues
        queued = stored_int(reply[10])
        ready = None if queued is None else ready + max(queued, 0)
    if values is None or ready is None:
        return sub.counts(check=False)
    accepted, filtered, done, retried, reclaimed, requeued, in_flight = values
    return Counts(
        accepted=accepted,
        filtered=filtered,
        ready=max(ready, 0),
        delayed=int(reply[8]),
        in_flight=in_flight,
        done=done,
        dead=int(reply[9]),
        retried=retried,
        reclaimed=reclaimed,
        requeued=requeued,
    )


def _sum_counts(parts: Sequence[Counts]) -> Counts:
    return Counts(
        accepted=sum(c.accepted for c in parts),
        filtered=sum(c.filtered for c in parts),
        ready=sum(c.ready for c in parts),
        delayed=sum(c.delayed for c in parts),
        in_flight=sum(c.in_flight for c in parts),
        done=sum(c.done for c in parts),
        dead=sum(c.dead for c in parts),
        retried=sum(c.retried for c in parts),
        reclaimed=sum(c.reclaimed for c in parts),
        requeued=sum(c.requeued for c in parts),
    )


class _PartsFilter(Filter):
    """The DONE filters of a crawl's partitions as one :class:`Filter` (partition 0's
    spec and base stand for the rest where one is needed)."""

    def __init__(self, parts: Sequence[Filter]) -> None:
        first = parts[0]
        super().__init__(first.client, first.spec, first.base, clock=first._clock)
        self.parts = list(parts)

    def contains(self, fps: Sequence[bytes]) -> list[bool]:
        """Whether each fingerprint is in any partition's filter (a fingerprint's
        partition is its site's, which a fingerprint alone does not tell)."""
        found = [False] * len(fps)
        for part in self.parts:
            for i, there in enumerate(part.contains(fps)):
                found[i] = found[i] or there
        return found

    def add(self, fps: Sequence[bytes]) -> list[bool]:
        """Added to every partition's filter: a fingerprint alone does not tell its
        request's partition (its site's), and a push checks only that partition's filter
        (``redcrawl import-dupefilter`` and the import of a scrapy-redis dupefilter add
        fingerprints alone; so an imported fingerprint costs P entries). For each: True
        if it was new in every partition (in none before, nor earlier in this batch)."""
        new = [True] * len(fps)
        for part in self.parts:
            for i, added in enumerate(part.add(fps)):
                new[i] = new[i] and added
        return new

    def redis_keys(self, count: int | None = None) -> list[bytes]:
        return [k for part in self.parts for k in part.redis_keys(count)]

    def memory(self) -> int:
        return sum(part.memory() for part in self.parts)

    def clear(self) -> int:
        return sum(part.clear() for part in self.parts)

    def configure(self) -> str | None:
        """Each partition's (on a cluster the partitions' servers differ)."""
        warnings = [w for w in (part.configure() for part in self.parts) if w]
        return warnings[0] if warnings else None

    def health(self, sample: int = 64) -> list[str]:
        """Every partition's problems, each partition sampled with ``sample / P`` buckets
        (at least 4); a server limit's problem is said once per distinct text."""
        each = max(4, sample // len(self.parts))
        out: list[str] = []
        for p, part in enumerate(self.parts):
            for problem in part.health(each):
                if problem.startswith("set-max-intset-entries"):
                    if problem not in out:
                        out.append(problem)
                else:
                    out.append(f"partition {p}: {problem}")
        return out


class PartitionedLists(PartitionedFrontier):
    """A partitioned crawl on the lists backend."""

    BACKEND = "lists"
    PART = ListsFrontier


class PartitionedStreams(PartitionedFrontier):
    """A partitioned crawl on the streams backend (each partition has its shards)."""

    BACKEND = "streams"
    PART = StreamsFrontier

    def shards(self, limit: int = 100) -> list[ShardInfo]:
        """:meth:`StreamsFrontier.shards` of every partition (each stream's key names its
        partition; request ids as the crawl prints them)."""
        out: list[ShardInfo] = []
        for p, sub in enumerate(self.parts):
            for info in cast(StreamsFrontier, sub).shards(limit):
                entries = [replace(e, id=_wrap_text(p, e.id)) for e in info.entries]
                out.append(replace(info, entries=entries))
        return out


def partitioned_class(backend: str) -> type[PartitionedFrontier]:
    """The partitioned frontier of ``backend``."""
    return PartitionedStreams if backend == "streams" else PartitionedLists
