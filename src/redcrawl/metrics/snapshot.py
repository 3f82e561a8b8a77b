"""One bounded read of what Redis holds about the crawls: :func:`read_snapshot`.

The exporter (``/metrics``, ``redcrawl exporter``), the watchdog (``redcrawl watch``) and
``redcrawl top`` all look at the fleet through this one read, so they agree. What it costs
does not depend on how big a crawl is:

=======================  ===============================================================
which crawls             the ones given, else the crawl registry (one SMEMBERS and an
                         EXISTS per crawl: metrics/registry.py) once it is complete,
                         until then one SCAN over the stats keys only
                         (``rc:{*}:stats``), at most ``scan_budget`` SCAN calls and
                         ``max_crawls`` crawls (the rest are counted as left out); a
                         SCAN that runs out of budget goes on from there at the next
                         read (see :meth:`SnapshotReader.find_crawls`); a pass that
                         ends completes the registry
per crawl                ``FrontierCore.counts()`` (one MULTI of O(1) commands, or one
                         script on streams), the stats hash (fixed fields, plus what
                         ``add_stats`` adds), the workers' heartbeat hash (one field per
                         worker that did not close cleanly), the size of each ready tier;
                         streams: one XPENDING summary and one XLEN per stream (2 x shards)
the Redis server         one INFO, one TIME
then, per crawl          the counter hash of each live listed worker (at most
                         ``top_workers``); with politeness: ZCOUNT of each tier's open
                         zset up to now, its ZCARD (keys with ready work) and the first
                         ``OPEN_SAMPLE`` open keys of each tier, a ZCOUNT of the keys
                         blocked by 429/503, then the length of each sampled key's ready
                         queue;
                         lists with requests in flight: the ``LEASE_SAMPLE`` leases with
                         the oldest deadlines, then their records (who holds them)
=======================  ===============================================================

The counts take one round trip per crawl (they must be one consistent read each);
everything else, for every crawl, goes in one pipeline, then one more for what needs the
server's time and the workers' names, then one for the sampled queues (politeness only).

"Leasable now" (:attr:`CrawlSnapshot.leasable`), the scaling signal: 0 while paused;
without politeness every ready request (delayed ones are apart, in DELAYED); with
politeness, for each sampled open key (one with ready work whose next grant is due and
a slot free) the smaller of its ready queue and what it may be granted at once (1 with a
delay, else the crawl's default concurrency; per-key overrides are not read), scaled to
every open key by the sample's mean. Exact up to ``OPEN_SAMPLE`` open keys per tier
(less the in-flight requests of keys with a concurrency over 1 and no delay).

A partitioned crawl (``REDCRAWL_PARTITIONS`` = P > 1) is read as the sum of its
partitions, with the same round trips: its counts are ``counts()`` (each partition's in one
pipelined round), and the per-crawl reads above are made in every partition, in the same
pipelines (one round per node on a cluster), then summed or merged (counters and the
latency histogram summed, each worker's latest heartbeat, open and blocked keys summed,
the sampled leases ``ceil(LEASE_SAMPLE / P)`` per partition, at least 4); the paused flag,
the politeness defaults and the workers' counter hashes are the anchor's. Never a SCAN
over a crawl: P times a few commands per crawl.

The crawls' frontiers are opened once and kept (opening one reads its layout). A crawl
whose state can't be read (corrupt counters) is left out and counted, so the other
crawls are still exported.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import redis

from redcrawl.errors import RedcrawlError
from redcrawl.frontier import Counts, FrontierCore
from redcrawl.frontier.opened import Layout, OpenFrontiers
from redcrawl.frontier.partitioned import PartitionedFrontier
from redcrawl.frontier.records import stored_int
from redcrawl.frontier.streams import GROUP
from redcrawl.keys import CrawlKeys, crawl_of_stats_key, stats_key_pattern
from redcrawl.metrics.registry import adopt, alive, registered
from redcrawl.settings import Settings

__all__ = [
    "LEASE_SAMPLE",
    "MAX_CRAWLS",
    "OPEN_SAMPLE",
    "SCAN_BUDGET",
    "TOP_WORKERS",
    "CrawlSnapshot",
    "RedisInfo",
    "Snapshot",
    "SnapshotReader",
    "StreamPending",
    "WorkerBeat",
    "read_snapshot",
]

log = logging.getLogger(__name__)

MAX_CRAWLS = 100
"""Most crawls one snapshot reads (``--max-crawls``)."""
SCAN_BUDGET = 50
"""Most SCAN calls (COUNT 1000 each) spent finding crawls by their stats keys."""
TOP_WORKERS = 50
"""Most workers per crawl listed one by one (the most recent heartbeats first)."""
OPEN_SAMPLE = 20
"""Open politeness keys per tier whose ready queues are read for the leasable estimate."""
LEASE_SAMPLE = 50
"""Leases with the oldest deadlines whose holders are read (lists): a worker whose
heartbeat stopped holds the oldest ones (a live worker's are renewed)."""


@dataclass(frozen=True, slots=True)
class WorkerBeat:
    worker: str
    deadline: float
    """Heartbeat deadline (seconds since the epoch, Redis server clock)."""
    age: float
    """Seconds since its last heartbeat, estimated as ``now - (deadline - lease_ttl)``
    (a heartbeat sets the deadline to now + the lease ttl; workers with another ttl than
    the reader's settings skew this estimate by the difference)."""
    alive: bool
    """Its heartbeat deadline is still ahead."""


@dataclass(frozen=True, slots=True)
class StreamPending:
    shard: int
    stream: str
    """``high`` or ``low``."""
    pending: int
    oldest_age: float
    """Seconds since the oldest pending entry was added to the stream (0 if none)."""


@dataclass(slots=True)
class CrawlSnapshot:
    crawl: str
    backend: str
    counts: Counts
    stats: dict[str, int]
    now: float
    workers: list[WorkerBeat]
    """The :data:`TOP_WORKERS` most recent heartbeats, most recent first."""
    workers_known: int
    workers_alive: int
    paused: bool
    streams: list[StreamPending] = field(default_factory=list)
    worker_counters: dict[str, dict[str, float]] = field(default_factory=dict)
    """Counter hash of each live listed worker (``CrawlKeys.worker_counters``): pages,
    ok, failed, bytes, items, pages_per_s, success."""
    lost_partitions: int = 0
    """Partitions that lost their state (``FrontierCore.lost_partitions``)."""
    leasable: int = 0
    """Ready requests that can be leased now (estimate with politeness: module docstring)."""
    open_keys: int | None = None
    """Politeness keys with ready work that may be served now (None: no politeness)."""
    keys_ready: int | None = None
    """Politeness keys with ready work (ZCARD of each tier's ``open`` zset, summed: a key
    with ready work in two tiers counts twice; None: no politeness)."""
    keys_blocked: int | None = None
    """Politeness keys blocked now by a 429/503 (``ZCOUNT`` of the crawl's
    ``pol_blocked`` zset after now; operators' blocks are not counted; None: no
    politeness)."""
    holding: dict[str, int] = field(default_factory=dict)
    """Listed workers that hold leases: lists, how many of the :data:`LEASE_SAMPLE`
    leases with the oldest deadlines are theirs (a lease is one ``lease()`` call);
    streams, their pending entries (XPENDING summary)."""
    ready_by_tier: dict[str, int] = field(default_factory=dict)
    """Ready requests per tier: ``"0"``, ``"1"``, ... (lists), ``high``/``low`` (streams,
    summed over shards). Read apart from :attr:`counts`, so the sum may differ from
    ``counts.ready`` by what moved in between."""

    @property
    def died(self) -> int:
        return self.stats.get("died", 0)


@dataclass(frozen=True, slots=True)
class RedisInfo:
    used_memory: int
    maxmemory: int
    evicted_keys: int
    connected_clients: int
    rdb_last_bgsave_ok: bool
    rdb_last_save_time: int
    aof_enabled: bool
    aof_last_write_ok: bool

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> RedisInfo:
        return cls(
            used_memory=int(info.get("used_memory", 0)),
            maxmemory=int(info.get("maxmemory", 0)),
            evicted_keys=int(info.get("evicted_keys", 0)),
            connected_clients=int(info.get("connected_clients", 0)),
            rdb_last_bgsave_ok=info.get("rdb_last_bgsave_status", "ok") == "ok",
            rdb_last_save_time=int(info.get("rdb_last_save_time", 0)),
            aof_enabled=bool(int(info.get("aof_enabled", 0))),
            aof_last_write_ok=info.get("aof_last_write_status", "ok") == "ok",
        )


@dataclass(slots=True)
class Snapshot:
    crawls: list[CrawlSnapshot]
    redis: RedisInfo | None
    """None if INFO was refused (e.g. an ACL user without it)."""
    now: float
    """Redis server clock, seconds since the epoch."""
    crawls_left_out: int
    """Crawls found but not read (over ``max_crawls``)."""
    duration: float
    """Seconds the read took."""
    crawls_unreadable: int = 0
    """Crawls found whose state could not be read (e.g. corrupt counters; logged)."""


class SnapshotReader:
    """Reads :class:`Snapshot` s from one Redis; keeps the crawls' frontiers open between
    reads. ``crawls``: the crawls to read (else every crawl found, up to ``max_crawls``)."""

    def __init__(
        self,
        client: redis.Redis,
        settings: Settings,
        *,
        crawls: Sequence[str] = (),
        max_crawls: int = MAX_CRAWLS,
        scan_budget: int = SCAN_BUDGET,
        top_workers: int = TOP_WORKERS,
    ) -> None:
        self.client: Any = client
        self.settings = settings
        self.crawls = list(crawls)
        self.max_crawls = max_crawls
        self.scan_budget = scan_budget
        self.top_workers = top_workers
        self._frontiers = OpenFrontiers(lambda: self.client, settings, 4 * max_crawls)
        self._lock = threading.Lock()
        self._cursor: Any = 0
        """Where the SCAN of the crawls goes on at the next read (0: a new pass)."""
        self._passing: set[str] = set()
        """Crawls found so far by the pass under way (it did not fit in one budget)."""
        self._known: set[str] = set()
        """Crawls found by the last complete pass."""

    def find_crawls(self) -> tuple[list[str], int]:
        """(crawls to read, how many more were found): the crawl registry once it is
        complete (:mod:`redcrawl.metrics.registry`), else a SCAN over stats keys only,
        whose first full pass completes the registry.

        At most :attr:`scan_budget` SCAN calls per read. A keyspace too big for one
        budget (a SCAN walks every key: a crawl's done filter alone holds about one key
        per 2 to 300 done URLs) is walked over several reads, each going on where the
        last stopped; until that pass ends, a read gets the crawls of the last complete
        pass and those found so far. Names found by earlier reads are checked (one
        pipelined ``EXISTS`` each): a purged crawl is dropped at once."""
        if self.crawls:
            return self.crawls[: self.max_crawls], max(0, len(self.crawls) - self.max_crawls)
        prefix = self.settings.key_prefix
        listed, complete = registered(self.client, prefix)
        if complete:  # the crawl registry has every crawl: no SCAN
            names = self._existing(sorted(listed))
            return names[: self.max_crawls], max(0, len(names) - self.max_crawls)
        found: set[str] = set()
        with self._lock:
            cursor = self._cursor
        whole = int(cursor) == 0  # this pass starts here: ends here or not at all
        for _ in range(self.scan_budget):
            cursor, keys = self.client.scan(cursor, match=stats_key_pattern(prefix), count=1000)
            found.update(n for n in (crawl_of_stats_key(k, prefix) for k in keys) if n)
            if int(cursor) == 0:
                break
        partial = int(cursor) != 0
        with self._lock:
            self._cursor = cursor
            if partial:
                self._passing |= found
                found = self._known | self._passing
            else:  # a pass ended here: it found every crawl there is
                self._known, self._passing = self._passing | found, set()
                found = set(self._known)
        if not partial:
            adopt(self.client, prefix, found)  # the registry is complete from now on
        if found and not (whole and not partial):
            # names from earlier reads: those purged since are dropped
            names = sorted(found)
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.exists(CrawlKeys(name, prefix).stats)
            found = {n for n, there in zip(names, pipe.execute(), strict=True) if there}
        names = self._existing(sorted(found | listed))
        return names[: self.max_crawls], max(0, len(names) - self.max_crawls)

    def _existing(self, names: list[str]) -> list[str]:
        """``names`` without the purged crawls (:func:`~redcrawl.metrics.registry.alive`,
        a fleet waiting for its first URL kept): the metrics no longer show a purged
        crawl, nor write its dashboard history again."""
        prefix = self.settings.key_prefix
        return [
            n
            for n, ok in zip(names, alive(self.client, prefix, names, waiting=True), strict=True)
            if ok
        ]

    def frontier(self, crawl: str, layout: Layout | None = None) -> FrontierCore:
        """The crawl's frontier, opened once (concurrent scrapes share the reader) and
        again if the crawl was made again with another layout (``layout``: its stored
        layout fields, if the caller read them)."""
        return self._frontiers.get(crawl, layout)

    def read(self) -> Snapshot:
        started = time.perf_counter()
        names, left_out = self.find_crawls()
        frontiers: list[FrontierCore] = []
        counts: list[Counts] = []
        lost: list[int] = []
        unreadable = 0
        layouts = self._frontiers.layouts(names)  # (one round: reopened if changed)
        for name, layout in zip(names, layouts, strict=True):
            # each crawl's counts: one consistent read (a round trip)
            try:
                f = self.frontier(name, layout)
                c, gone = f.counts(), len(f.lost_partitions())  # (partitioned: a round)
                counts.append(c)
                lost.append(gone)
                frontiers.append(f)
            except RedcrawlError as exc:  # e.g. corrupt counters: the other crawls still count
                log.warning("metrics: crawl %s left out: %s", name, exc)
                unreadable += 1
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        pipe.info()
        streams: list[list[tuple[int, str, str]]] = []
        for f in frontiers:
            subs = _subs(f)
            for sub in subs:
                pipe.hgetall(sub.keys.stats)
            for sub in subs:
                pipe.hgetall(sub.keys.workers)
            pipe.hget(f.keys.control, "paused")
            pipe.hget(f.keys.control, "politeness")
            rows = [row for sub in subs for row in _stream_rows(sub)]
            streams.append(rows)
            for _s, _c, key in rows:
                pipe.xpending(key, GROUP)
                pipe.xlen(key)
            # a crawl with fleet-wide politeness keeps its ready work in per-site queues:
            # no per-tier count without reading them all (its total is in counts())
            for tier in range(f.keys.tiers if not rows and f.politeness is None else 0):
                for sub in subs:
                    if f.settings.ordering == "priority":
                        pipe.zcard(sub.keys.ready(tier))
                    else:
                        pipe.llen(sub.keys.ready(tier))
        res = pipe.execute(raise_on_error=False)
        sec, usec = res[0]
        now = float(sec) + float(usec) / 1e6
        info = RedisInfo.from_info(res[1]) if isinstance(res[1], dict) else None
        out: list[CrawlSnapshot] = []
        grants: list[int] = []
        at = 2
        for f, c, rows, gone in zip(frontiers, counts, streams, lost, strict=True):
            n = len(_subs(f))
            stats_raw, workers_raw = res[at : at + n], res[at + n : at + 2 * n]
            paused, pol_raw = res[at + 2 * n : at + 2 * n + 2]
            at += 2 * n + 2
            pend = res[at : at + 2 * len(rows)]
            at += 2 * len(rows)
            tiers = 0 if rows or f.politeness is not None else f.keys.tiers
            snap = self._crawl(f, c, now, stats_raw, workers_raw, paused, rows, pend[::2])
            snap.lost_partitions = gone
            if rows and f.politeness is None:  # (with politeness: per-key queues, as above)
                for (_s, cls, _k), summary, length in zip(rows, pend[::2], pend[1::2], strict=True):
                    if isinstance(length, int):
                        held = int(summary["pending"]) if isinstance(summary, dict) else 0
                        snap.ready_by_tier[cls] = snap.ready_by_tier.get(cls, 0) + max(
                            0, length - held
                        )
            else:
                lengths = res[at : at + tiers * n]
                snap.ready_by_tier = {
                    str(t): sum(x for x in lengths[t * n : (t + 1) * n] if isinstance(x, int))
                    for t in range(tiers)
                }
            at += tiers * n
            out.append(snap)
            grants.append(_grants(pol_raw))
        self._second_round(frontiers, out, grants, now)
        return Snapshot(out, info, now, left_out, time.perf_counter() - started, unreadable)

    def _second_round(
        self,
        frontiers: list[FrontierCore],
        crawls: list[CrawlSnapshot],
        grants: list[int],
        now: float,
    ) -> None:
        """The live workers' counters and the leasable estimate (see the module
        docstring): one pipeline, then one more for the sampled queues."""
        if not frontiers:
            return
        pipe = self.client.pipeline(transaction=False)
        now_ms = int(now * 1000)
        for f, c in zip(frontiers, crawls, strict=True):
            _ask_second(pipe, f, c, now_ms)
        res = iter(pipe.execute(raise_on_error=False))
        sampled: list[tuple[int, _OpenSample]] = []  # (crawl index, its open sample)
        expired: list[tuple[int, str, list[bytes]]] = []  # (crawl, leases key, tokens)
        for i, (f, c) in enumerate(zip(frontiers, crawls, strict=True)):
            subs = _subs(f)
            for w in c.workers:
                raw = next(res) if w.alive else None
                if isinstance(raw, dict) and raw:
                    c.worker_counters[w.worker] = _floats(raw)
            width = 3 * f.keys.tiers + 1
            open_replies = [next(res) for _ in range(width * len(subs))] if f.politeness else []
            if _expired_wanted(f, c):
                for sub in subs:
                    tokens = next(res)
                    if isinstance(tokens, list) and tokens:
                        expired.append((i, sub.keys.leases, tokens))
            c.leasable = 0 if c.paused else c.counts.ready
            if f.politeness is not None:
                sample = self._open_queues(subs, c, iter(open_replies))
                c.leasable = 0
                if sample.entries:
                    sampled.append((i, sample))
        if sampled or expired:
            self._third_round(frontiers, crawls, grants, sampled, expired)

    @staticmethod
    def _open_queues(
        subs: Sequence[FrontierCore], c: CrawlSnapshot, res: Iterator[Any]
    ) -> _OpenSample:
        """Count the crawl's keys with ready work (``c.keys_ready``, per tier) and blocked
        ones from their replies in ``res`` (summed over its partitions ``subs``); returns
        its open keys per tier with their sample (the third round counts them)."""
        c.open_keys, c.keys_ready = 0, 0
        sample = _OpenSample()
        blocked_sum: int | None = None
        for j, f in enumerate(subs):
            for t in range(f.keys.tiers):
                n, members, ready = next(res), next(res), next(res)
                if isinstance(ready, int):
                    c.keys_ready += ready
                if isinstance(n, int) and isinstance(members, list):
                    c.open_keys += n  # (per tier: made a count of sites in _estimate)
                    sample.counts[(j, t)] = n
                    sample.entries += [(j, t, bytes(m)) for m in members]
            blocked = next(res)
            if isinstance(blocked, int):
                blocked_sum = (blocked_sum or 0) + blocked
        c.keys_blocked = blocked_sum
        return sample

    def _third_round(
        self,
        frontiers: list[FrontierCore],
        crawls: list[CrawlSnapshot],
        grants: list[int],
        sampled: list[tuple[int, _OpenSample]],
        expired: list[tuple[int, str, list[bytes]]],
    ) -> None:
        """The sampled open sites' ready queues in every tier (the open and leasable
        estimates) and the holders of the sampled expired leases (lists), in one
        pipeline."""
        pipe = self.client.pipeline(transaction=False)
        for i, sample in sampled:
            subs = _subs(frontiers[i])
            for j, key in sample.sites():
                sub = subs[j]
                for t in range(sub.keys.tiers):
                    q = sub.keys.pol_queue_base.encode() + str(t).encode() + b":" + key
                    if sub.settings.ordering == "priority":
                        pipe.zcard(q)
                    else:
                        pipe.llen(q)
        for _i, leases, tokens in expired:
            pipe.hmget(leases, tokens)
        lengths = iter(pipe.execute(raise_on_error=False))
        for i, sample in sampled:
            subs = _subs(frontiers[i])
            for j, key in sample.sites():
                got = [next(lengths) for _ in range(subs[j].keys.tiers)]
                sample.ready[(j, key)] = [n if isinstance(n, int) else 0 for n in got]
            _estimate(crawls[i], grants[i], sample)
        for i, _leases, _tokens in expired:
            records = next(lengths)
            c = crawls[i]
            listed = {w.worker for w in c.workers}
            for raw in records if isinstance(records, list) else []:
                worker = _lease_holder(raw)
                if worker in listed:
                    c.holding[worker] = c.holding.get(worker, 0) + 1

    def _crawl(
        self,
        f: FrontierCore,
        c: Counts,
        now: float,
        stats_raw: Sequence[Any],
        workers_raw: Sequence[Any],
        paused: Any,
        rows: list[tuple[int, str, str]],
        pend: list[Any],
    ) -> CrawlSnapshot:
        """One crawl's snapshot; ``stats_raw`` and ``workers_raw``: the hashes of each of
        its partitions (one for a crawl of one partition), summed and merged here."""
        stats: dict[str, int] = {}
        deadlines: dict[str, float] = {}
        for raw in stats_raw:
            for k, v in raw.items() if isinstance(raw, dict) else ():
                value = stored_int(v)
                if value is not None:
                    name = k.decode(errors="replace")
                    stats[name] = stats.get(name, 0) + value
        for raw in workers_raw:
            for k, v in raw.items() if isinstance(raw, dict) else ():
                name = k.decode(errors="replace")
                deadline = (stored_int(v) or 0) / 1000
                deadlines[name] = max(deadline, deadlines.get(name, 0.0))
        ttl = self.settings.lease_ttl
        beats = [
            WorkerBeat(name, deadline, max(0.0, now - (deadline - ttl)), deadline > now)
            for name, deadline in deadlines.items()
        ]
        beats.sort(key=lambda b: (-b.deadline, b.worker))
        alive = sum(1 for b in beats if b.alive)
        pending = []
        for (shard, cls, _key), summary in zip(rows, pend, strict=True):
            if not isinstance(summary, dict) or not summary.get("pending"):
                if isinstance(summary, dict):
                    pending.append(StreamPending(shard, cls, 0, 0.0))
                continue
            low = summary.get("min")
            low_ms = int((low.decode() if isinstance(low, bytes) else str(low)).split("-")[0])
            pending.append(
                StreamPending(shard, cls, int(summary["pending"]), max(0.0, now - low_ms / 1000))
            )
        pending = _merge_pending(pending)
        listed = {b.worker for b in beats[: self.top_workers]}
        holding: dict[str, int] = {}
        for summary in pend:  # streams: pending entries per consumer (= worker)
            for row in summary.get("consumers") or [] if isinstance(summary, dict) else []:
                name = row["name"]
                name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
                if name in listed and int(row["pending"]):
                    holding[name] = holding.get(name, 0) + int(row["pending"])
        return CrawlSnapshot(
            holding=holding,
            crawl=f.crawl,
            backend=f.BACKEND,
            counts=c,
            stats=stats,
            now=now,
            workers=beats[: self.top_workers],
            workers_known=len(beats),
            workers_alive=alive,
            paused=paused == b"1",
            streams=pending,
        )


@dataclass
class _OpenSample:
    """One crawl's open politeness keys: per (partition, tier) how many are open now
    (``ZCOUNT``), the first ``OPEN_SAMPLE`` of each, and (third round) each sampled site's
    ready queue length in every tier."""

    counts: dict[tuple[int, int], int] = field(default_factory=dict)
    entries: list[tuple[int, int, bytes]] = field(default_factory=list)  # (part, tier, key)
    ready: dict[tuple[int, bytes], list[int]] = field(default_factory=dict)

    def sites(self) -> list[tuple[int, bytes]]:
        return list(dict.fromkeys((j, key) for j, _t, key in self.entries))


def _estimate(c: CrawlSnapshot, grants: int, sample: _OpenSample) -> None:
    """The crawl's open sites and leasable requests from its open sample. A site with
    ready work in k tiers is open in each of them (one entry per tier), so each sampled
    entry counts 1/k of a site, and of the requests its site may be granted at once (its
    ready queues summed over its tiers, at most ``grants``); each tier's mean is scaled
    to its open count. Exact while each tier has at most OPEN_SAMPLE open sites."""
    per: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for j, t, key in sample.entries:
        queues = sample.ready.get((j, key), [])
        k = max(1, sum(1 for n in queues if n > 0))
        per.setdefault((j, t), []).append((1 / k, min(sum(queues), grants) / k))
    sites = leasable = 0.0
    for jt, n in sample.counts.items():
        got = per.get(jt)
        if not got:
            sites += n  # (none sampled: the tier's count as it is)
            continue
        sites += n * sum(a for a, _ in got) / len(got)
        leasable += n * sum(b for _, b in got) / len(got)
    c.open_keys = round(sites)
    c.leasable = 0 if c.paused else min(round(leasable), c.counts.ready)


def _subs(f: FrontierCore) -> list[FrontierCore]:
    """The frontiers whose keys hold ``f``'s state: a partitioned crawl's partitions, else
    ``f`` itself."""
    return list(f.parts) if isinstance(f, PartitionedFrontier) else [f]


def _merge_pending(rows: list[StreamPending]) -> list[StreamPending]:
    """One row per (shard, stream class): a partitioned crawl's partitions each have every
    shard's streams (pending summed, the oldest age kept)."""
    merged: dict[tuple[int, str], StreamPending] = {}
    for r in rows:
        had = merged.get((r.shard, r.stream))
        merged[(r.shard, r.stream)] = (
            r
            if had is None
            else StreamPending(
                r.shard, r.stream, had.pending + r.pending, max(had.oldest_age, r.oldest_age)
            )
        )
    return list(merged.values())


def _ask_second(pipe: Any, f: FrontierCore, c: CrawlSnapshot, now_ms: int) -> None:
    """Queue one crawl's reads of :meth:`SnapshotReader._second_round`: its live listed
    workers' counters, its politeness reads and its oldest leases, in every partition."""
    for w in c.workers:
        if w.alive:
            pipe.hgetall(f.keys.worker_counters(w.worker))
    subs = _subs(f)
    if f.politeness is not None:
        for sub in subs:
            _ask_politeness(pipe, sub, now_ms)
    if _expired_wanted(f, c):
        sample = LEASE_SAMPLE if len(subs) == 1 else max(4, -(-LEASE_SAMPLE // len(subs)))
        for sub in subs:
            pipe.zrange(sub.keys.inflight, 0, sample - 1)


def _ask_politeness(pipe: Any, f: FrontierCore, now_ms: int) -> None:
    """Queue the politeness reads of one crawl (``3 * tiers + 1`` replies, read by
    :meth:`SnapshotReader._open_queues`): per tier its open keys (ZCOUNT up to now), a
    sample of them and its keys with ready work (ZCARD); then the keys blocked now."""
    for t in range(f.keys.tiers):
        pipe.zcount(f.keys.open(t), "-inf", now_ms)
        pipe.zrangebyscore(f.keys.open(t), "-inf", now_ms, start=0, num=OPEN_SAMPLE)
        pipe.zcard(f.keys.open(t))
    pipe.zcount(f.keys.pol_blocked, f"({now_ms}", "+inf")


def _expired_wanted(f: FrontierCore, c: CrawlSnapshot) -> bool:
    """Whether to read who holds the crawl's oldest leases (lists; streams have each
    worker's pending entries exactly in XPENDING's summary)."""
    return f.BACKEND == "lists" and c.counts.in_flight > 0


def _lease_holder(raw: Any) -> str | None:
    """The worker of a stored lease record (``CrawlKeys.leases``: msgpack ``[since_ms,
    worker, id, ...]``), or None."""
    if not isinstance(raw, bytes):
        return None
    try:
        t = msgpack.unpackb(raw, raw=True)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    if isinstance(t, list) and len(t) > 1 and isinstance(t[1], bytes):
        return t[1].decode(errors="replace")
    return None


def _floats(raw: dict[Any, Any]) -> dict[str, float]:
    out = {}
    for k, v in raw.items():
        try:
            out[k.decode(errors="replace")] = float(v)
        except (ValueError, TypeError):
            continue  # a corrupt field: left out
    return out


def _grants(raw: Any) -> int:
    """What one open politeness key may be granted at once, from the crawl's stored
    defaults (``control`` field ``politeness``): 1 with a delay, else its concurrency."""
    try:
        pol = json.loads(raw) if raw else {}
        if float(pol.get("delay") or 0) > 0:
            return 1
        return max(1, int(pol.get("concurrency") or 1))
    except (ValueError, TypeError, AttributeError):
        return 1


def _stream_rows(f: FrontierCore) -> list[tuple[int, str, str]]:
    """(shard, "high"/"low", key) of each stream of a streams crawl; none for lists."""
    if f.BACKEND != "streams":
        return []
    shards = f.settings.shards
    return [
        (s, "high" if high else "low", f.keys.stream(s, high))
        for high in (True, False)
        for s in range(shards)
    ]


def read_snapshot(client: redis.Redis, settings: Settings, **options: Any) -> Snapshot:
    """One :class:`Snapshot` (options as :class:`SnapshotReader`'s)."""
    return SnapshotReader(client, settings, **options).read()
