"""Re-home a stopped crawl into another number of partitions while copying it:
``redcrawl migrate --to URL --partitions P`` (docs/cluster.md, "Moving a crawl").

:func:`rehome_crawl` is :func:`redcrawl.migrate_to.copy_crawl`'s path when the copy's
partition count differs from the source's (a one-partition crawl on one server into
P = 16 partitions on a cluster, say). The checks are the copy's (a running crawl, an
existing target crawl, the source itself as target are refused before anything is
written); the source is only read. What moves where:

- **Requests** (the request hash, read with HSCAN) go to the partition
  :func:`~redcrawl.keys.partition_of` their politeness key names: the key stored in the
  record (crawls with politeness), else the key :meth:`PartitionedFrontier.partition
  <redcrawl.frontier.partitioned.PartitionedFrontier.partition>` computes from the
  envelope (the routing the copy's workers use). Records are copied byte for byte (push
  stamp and attempts kept). DELAYED and DEAD keep their times and last errors, deferral
  counts follow their request.
- **Ready requests are placed by the copy's own scripts**: each is written as a delayed
  request that is already due, and the copy's ``maintain`` promotes it, as a due request
  is promoted in any crawl, so every backend, ordering and politeness layout builds its
  queues its own way (lists tiers, per-site queues and their open schedule, streams).
  The due times are ranked so that each queue serves in the source's order (FIFO and
  LIFO; a priority crawl by priority, not by push order within a priority).
- **In flight goes back to ready in the copy**, as an expired lease is taken back: the
  token cleared, attempts kept (the delivery counted), ``reclaimed`` counted; one whose
  attempts are used up goes to DEAD with the reclaim's error text (``died`` counted).
- **Per-site politeness state moves with its site**: the per-key state hash (next time,
  block, AutoThrottle's delay, backoff) is copied under the site's partition (its
  in-flight count and ready marks dropped: the promotion sets them), overrides
  (operators', Crawl-delay) and blocks go to the site's partition; the crawl's
  ``DOWNLOAD_SLOTS`` and defaults, and its control switches (paused, AutoThrottle) go to
  every partition and the anchor.
- **Crawl-wide keys stay at the anchor** (``{<crawl>}``, where a partitioned crawl keeps
  them): the robots.txt cache, the dashboard history, RedisSpider start URLs, the
  standalone DupeFilter's filter. The crawl is added to the target's crawl registry.
- **The DONE filter** holds fingerprints without their site, so a partition cannot be
  given only its sites' share: target partition ``q`` gets a copy of source partition
  ``q mod Ps``'s filter (DUMP/RESTORE under the new name), which holds every DONE
  fingerprint of the sites that can hash to ``q`` (``hash mod Pt = q`` implies
  ``hash mod Ps = q mod Ps`` when ``Ps`` divides ``Pt``). Dedupe stays exact; the filters
  take ``Pt / Ps`` times the memory of the source's (measured in docs/cluster.md). Hence
  ``Pt`` must be a multiple of ``Ps`` (merging filters is not done).
- **Counters** are the source's, summed, in partition 0; each partition's ``accepted``
  is what it holds (partition 0 also the DONE ones), so per-partition conservation
  holds and the sums equal the source's. ``seq`` (the number ``#<seq>`` ids of requests
  without a fingerprint are drawn from) is per partition: each target partition starts
  from its source partition's, so its sum over partitions is not the source's.

Then the copy is verified: its counts equal the source's with the in-flight requests back
to ready (or DEAD), its counters equal but for those the give-back changes and ``seq``,
and the source unchanged. Any failure deletes every key the copy wrote.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redcrawl import codec
from redcrawl.errors import ConfigError, DecodeError, FrontierError, LayoutMismatch
from redcrawl.frontier import Counts, FrontierCore, open_frontier
from redcrawl.frontier.base import format_id
from redcrawl.frontier.partitioned import PartitionedFrontier, anchor_partitions
from redcrawl.frontier.records import parse_record, record_key, stored_int
from redcrawl.keys import MAX_PARTITIONS, CrawlKeys, crawl_registry, partition_of
from redcrawl.transport import redis_errors

__all__ = [
    "SEQ_COUNTER",
    "Rehomed",
    "check_partitions",
    "copy_pairs",
    "plan_keys",
    "rehome_crawl",
    "source_parts",
    "target_key_sets",
]

SEQ_COUNTER = "seq"
"""The per-partition counter of ``#<seq>`` ids (not summed by a re-home)."""
GIVE_BACK_COUNTERS = ("reclaimed", "died", "inflight", "ready")
"""Counters the give-back (and the promotion's own bookkeeping) changes."""
ANCHOR_PARTS = frozenset({"robots", "hist", "start", "fps"})
"""Key parts copied to the target's anchor under the same name."""
REBUILT_PARTS = frozenset(
    {"pq", "open", "ready", "s", "inflight", "leases", "left", "workers", "calls"}
)
"""Key parts not copied: ready queues (rebuilt by the promotion) and lease state
(nothing is in flight in the copy; a call's replay slot means nothing there)."""
REQUEST_PARTS = frozenset({"req", "delayed", "dead", "err", "defers"})
"""Key parts read request by request."""
_FRONT_BASE = 2_000_000_000.0
"""Due time (ms) of the first-served ready request where a promotion pushes to the
served end (lists, per-site queues): later-promoted is served earlier. All below any
real time, so all due."""
_APPEND_BASE = 1_000_000_000.0
"""Due time (ms) of the first-served one where a promotion appends (streams without
politeness)."""
REQUEST_BATCH = 1000
"""Records per HSCAN round (each written in one pipelined round, a command per
partition and structure)."""
_CONTROL_SKIP = frozenset(
    {b"layout", b"layout.copy", b"cursor", b"crawl.id", b"parts.id", b"parts.claimed"}
)
"""Control fields the copy keeps its own of: its layout, and the identities its creation
gave the anchor and every partition (``PartitionedFrontier.lost_partitions``; a worker's
``crawl.id`` is set when it first works there)."""


@dataclass
class Rehomed:
    """What a re-home placed (kept in :attr:`redcrawl.migrate_to.CopyResult.rehome`)."""

    source_partitions: int
    partitions: int
    requests: list[int] = field(default_factory=list)
    """Requests (not DONE) per target partition."""
    sites: int = 0
    """Per-site politeness states moved."""
    filter_copies: int = 0
    """DONE-filter keys written (the source's times ``partitions / source_partitions``)."""
    filter_bytes: int = 0
    """Bytes of DUMP payload of the DONE filter written (all copies)."""


def check_partitions(source_partitions: int, partitions: int) -> None:
    """Refuse a partition count a re-home cannot produce (:class:`ConfigError`)."""
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ConfigError("--partitions", f"{partitions} partitions; give 1 to {MAX_PARTITIONS}")
    if partitions % source_partitions:
        raise ConfigError(
            "--partitions",
            f"the crawl has {source_partitions} partitions and {partitions} is not a "
            f"multiple of {source_partitions}: its DONE filter (whose fingerprints carry "
            "no site) can be split only so; give a multiple, e.g. "
            f"{source_partitions * max(1, -(-partitions // source_partitions))}, or keep "
            f"{source_partitions}. Nothing was copied",
        )


def target_key_sets(client: Any, anchor: CrawlKeys, partitions: int) -> list[CrawlKeys]:
    """The key names a crawl of ``partitions`` partitions would use in ``client``, and
    those of a crawl of that name already there (whatever its partitions)."""
    with redis_errors("reading the target"):
        there = anchor_partitions(client.hgetall(anchor.control)) or 1
    return [anchor, *(anchor.part(q) for q in range(max(partitions, there)))]


def source_parts(src: FrontierCore) -> list[FrontierCore]:
    """The source crawl's partitions' frontiers (itself for one partition)."""
    return list(getattr(src, "parts", None) or [src])


def _split_name(key: bytes) -> tuple[str, str, str]:
    """(hash tag, part, rest after the part) of a crawl key ``<prefix>:{<tag>}:<rest>``."""
    text = key.decode("latin-1")
    start, end = text.find("{"), text.find("}")
    tag = text[start + 1 : end]
    rest = text[end + 2 :]
    part, _, tail = rest.partition(":")
    return tag, part, tail


def _renamed(key: bytes, tag: str) -> bytes:
    text = key.decode("latin-1")
    start, end = text.find("{"), text.find("}")
    return (text[: start + 1] + tag + text[end:]).encode("latin-1")


def _source_partition(tag: str, crawl: str) -> int | None:
    """The source partition of a hash tag (None: the anchor or a one-partition crawl)."""
    if tag == crawl:
        return None
    return int(tag.rsplit("/", 1)[1])


@dataclass
class _Side:
    """A source partition's state beside its records, read once (the delayed and dead
    sets, last errors, deferral counts, who holds what, the ready order)."""

    delayed: dict[bytes, float]
    dead: dict[bytes, float]
    err: dict[bytes, bytes]
    defers: dict[bytes, bytes]
    holders: dict[str, str]
    order: dict[bytes, int]
    tail: int
    lease_state_out: bool = False
    """The records keep no lease state (records.LEASE_STATE_OUT): in flight is what the
    leases hold (``holders``), and a record's token field is a fence, cleared in the
    copy (the copy's leases are new)."""
    seen: set[bytes] = field(default_factory=set)
    """Ids written (HSCAN may return one twice if the hash is resized meanwhile)."""


@dataclass
class _Plan:
    """The source's keys by what happens to them."""

    anchor: list[bytes] = field(default_factory=list)
    fpd: list[tuple[int, bytes]] = field(default_factory=list)
    states: list[tuple[str, bytes]] = field(default_factory=list)
    hashes: dict[str, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    queues: list[bytes] = field(default_factory=list)
    """Ready queues (tiers, per-site queues): rebuilt, their priority scores kept."""
    rebuilt: int = 0


def plan_keys(todo: Sequence[bytes], crawl: str) -> _Plan:
    """Sort the source's keys (:func:`~redcrawl.migrate_to.crawl_redis_keys`); a key of a
    kind this module does not know is refused, so that a key added to a crawl later is
    never silently left behind."""
    plan = _Plan()
    for key in todo:
        tag, part, tail = _split_name(key)
        p = _source_partition(tag, crawl) or 0
        if part in ANCHOR_PARTS:
            plan.anchor.append(key)
        elif part == "fpd":
            plan.fpd.append((p, key))
        elif part == "pol":
            plan.states.append((tail, key))
        elif part in ("polo", "polb", "pols", "control", "stats", *REQUEST_PARTS):
            plan.hashes[part].append(key)
        elif part in REBUILT_PARTS:
            plan.rebuilt += 1
            if part in ("ready", "pq"):
                plan.queues.append(key)
        else:
            raise FrontierError(
                f"{key.decode(errors='replace')}: a key of the crawl that a re-home into "
                "other partitions does not know how to move; nothing was copied. Copy the "
                "crawl keeping its partitions (no --partitions), and report this"
            )
    return plan


class Rehome:
    """One re-home (see the module docstring); :meth:`run` writes, verifies, and on any
    failure deletes what it wrote."""

    def __init__(
        self, src: FrontierCore, target: Any, partitions: int, batch: int, progress: Any
    ) -> None:
        self.src = src
        self.target = target
        self.parts = source_parts(src)
        self.ps = len(self.parts)
        self.pt = partitions
        self.batch = batch
        self.progress = progress
        settings = self.parts[0].settings.replace(partitions=partitions)
        self.settings = settings
        self.anchor = src.keys
        self.tkeys = [self.anchor.part(q) for q in range(partitions)]
        self.dst: PartitionedFrontier | None = None
        self.placed = [0] * partitions
        self.homes: dict[bytes, int] = {}
        """Request id -> its partition (strict priority without politeness only)."""
        self.priority = settings.ordering == "priority" and settings.backend == "lists"
        self.returned = 0
        self.dead_lettered = 0
        self.size = 0
        """Bytes written: DUMP payloads restored and request records."""
        self.restored = 0
        """Keys copied whole (DUMP/RESTORE): anchor keys, filter copies, site states."""
        self.info = Rehomed(self.ps, partitions, self.placed)
        # a promotion pushes to the served end except on streams without politeness
        first = self.parts[0]
        self.front = not (first.BACKEND == "streams" and first.politeness is None)

    # --- routing ---------------------------------------------------------------------
    def _q(self, rec: bytes, source_p: int) -> int:
        """The target partition of a stored record."""
        key = record_key(rec)
        if key is not None:
            return partition_of(key, self.pt)
        assert self.dst is not None
        try:
            env = codec.decode(parse_record(rec)[3])
        except DecodeError:
            return source_p  # (a corrupt record: dead-lettered where it is met)
        return self.dst.partition(env)

    # --- the writes ------------------------------------------------------------------
    def open_target(self) -> PartitionedFrontier:
        dst = open_frontier(self.target, self.settings, self.src.crawl)
        assert isinstance(dst, PartitionedFrontier)
        dst.maintain()  # creates the layout of the anchor and of every partition
        self.dst = dst
        return dst

    def write_crawl_wide(self, plan: _Plan) -> None:
        """Anchor keys, control switches, DOWNLOAD_SLOTS, overrides, blocks, the DONE
        filter's copies and the per-site states."""
        self.copy_pairs(self.target, [(k, k) for k in plan.anchor])
        control: dict[bytes, bytes] = {}
        for key in sorted(
            plan.hashes["control"], key=lambda k: _split_name(k)[0] == self.src.crawl
        ):
            control.update(self.src.client.hgetall(key))  # (the anchor's last: it wins)
        extra = {k: v for k, v in control.items() if k not in _CONTROL_SKIP}
        slots: dict[bytes, bytes] = {}
        for key in plan.hashes["pols"]:
            slots.update(self.src.client.hgetall(key))
        with redis_errors("writing the copy's switches"):
            pipe = self.target.pipeline(transaction=False)
            for keys in [self.anchor, *self.tkeys]:
                if extra:
                    pipe.hset(keys.control, mapping=extra)
            for keys in self.tkeys:
                if slots:
                    pipe.hset(keys.pol_slots, mapping=slots)
            for key in plan.hashes["polo"]:
                for site, value in self.src.client.hgetall(key).items():
                    q = partition_of(site.decode(errors="surrogateescape"), self.pt)
                    pipe.hset(self.tkeys[q].pol_override, site, value)
            for key in plan.hashes["polb"]:
                for site, until in self.src.client.zrange(key, 0, -1, withscores=True):
                    q = partition_of(site.decode(errors="surrogateescape"), self.pt)
                    pipe.zadd(self.tkeys[q].pol_blocked, {site: until})
            pipe.execute()
        pairs = []
        for p, key in plan.fpd:
            for q in range(p, self.pt, self.ps):
                pairs.append((key, _renamed(key, self.tkeys[q].tag)))
        self.info.filter_copies = len(pairs)
        self.info.filter_bytes = self.copy_pairs(self.target, pairs)
        moves = [
            (key, _renamed(key, self.tkeys[partition_of(site, self.pt)].tag))
            for site, key in plan.states
        ]
        self.copy_pairs(self.target, moves)
        self.info.sites = len(moves)
        with redis_errors("writing the copy's per-site states"):
            for start in range(0, len(moves), 1000):
                pipe = self.target.pipeline(transaction=False)
                for _old, new in moves[start : start + 1000]:
                    pipe.hdel(new, "in", "tm", "rdy")  # (set again by the promotion)
                pipe.execute()

    def write_requests(self) -> None:
        """Every request not DONE of every source partition, into its partition."""
        now = int(self.src.server_time() * 1000)
        for sp, part in enumerate(self.parts):
            c = part.counts()
            k = part.keys
            order: dict[bytes, int] = {}
            with redis_errors("reading the source's requests"):
                for _tier, ids in part._ready_ids(c.ready + 1):
                    for rid in ids:
                        order.setdefault(bytes(rid), len(order))
                side = _Side(
                    delayed=dict(self.src.client.zrange(k.delayed, 0, -1, withscores=True)),
                    dead=dict(self.src.client.zrange(k.dead, 0, -1, withscores=True)),
                    err=self.src.client.hgetall(k.err),
                    defers=self.src.client.hgetall(k.deferrals),
                    holders={i.id: i.worker for i in part.inflight(limit=c.in_flight + 1)},
                    order=order,
                    tail=len(order),
                    lease_state_out=part._lease_state_out(),
                )
            cursor: int | bytes = 0
            done = 0
            while True:
                with redis_errors("reading the source's requests"):
                    cursor, found = self.src.client.hscan(k.req, cursor, count=REQUEST_BATCH)
                if found:
                    self._write_batch(sp, found, side, now)
                    done += len(found)
                    if self.progress is not None:
                        self.progress("re-homing requests", done, c.accepted - c.done)
                if not cursor:
                    break

    def _state(
        self, rid: bytes, rec: bytes, side: _Side, now: int
    ) -> tuple[bytes, float | None, float | None, bytes | None]:
        """(record, due time, time of death, last error) of a request in the copy: its
        own when DELAYED or DEAD; in flight, taken back as an expired lease is (to
        READY, or DEAD once its attempts are used up); READY, a due time that ranks it."""
        why = side.err.get(rid)
        due, died = side.delayed.get(rid), side.dead.get(rid)
        head = rec.split(b"|", 3)
        if side.lease_state_out and len(head) == 4:
            # (no lease state in the record: in flight is what the leases hold, the delivery
            # in progress not yet in its attempts; the token field is a fence, cleared)
            held = format_id(rid) in side.holders and due is None and died is None
            spent = b"%d" % (int(head[1]) + 1) if held and head[1].isdigit() else head[1]
            head = [head[0], spent, b"held" if held else b"", head[3]]
            rec = b"|".join([head[0], head[1], b"", head[3]])
        if due is not None or died is not None:
            return rec, due, died, why
        if len(head) == 4 and head[2]:
            rec = b"|".join([head[0], head[1], b"", _held_mark(head[3])])
            max_attempts = self.settings.max_attempts
            attempts = int(head[1]) if head[1].isdigit() else max_attempts
            if attempts >= max_attempts:
                worker = side.holders.get(format_id(rid), "None")
                self.dead_lettered += 1
                why = f"lease expired {attempts} times (last worker: {worker})".encode()
                return rec, None, float(now), why
            self.returned += 1
            return rec, self._due(-1 - self.returned), None, why
        rank = side.order.get(rid)
        if rank is None:
            rank = side.tail
            side.tail += 1
        return rec, self._due(rank), None, why

    def _write_batch(self, sp: int, found: dict[bytes, bytes], side: _Side, now: int) -> None:
        """One HSCAN batch: each record to its partition, with its state; one command per
        partition and structure."""
        req: dict[int, dict[bytes, bytes]] = defaultdict(dict)
        delayed: dict[int, dict[bytes, float]] = defaultdict(dict)
        dead: dict[int, dict[bytes, float]] = defaultdict(dict)
        err: dict[int, dict[bytes, bytes]] = defaultdict(dict)
        defers: dict[int, dict[bytes, bytes]] = defaultdict(dict)
        for rid, raw in found.items():
            if rid in side.seen:
                continue
            side.seen.add(rid)
            q = self._q(bytes(raw), sp)
            if self.priority and self.parts[0].politeness is None:
                self.homes[rid] = q
            self.placed[q] += 1
            rec, due, died, why = self._state(rid, bytes(raw), side, now)
            req[q][rid] = rec
            self.size += len(rid) + len(rec)
            if died is not None:
                dead[q][rid] = died
            elif due is not None:
                delayed[q][rid] = due
                if rid in side.defers:
                    defers[q][rid] = side.defers[rid]
            if why is not None:
                err[q][rid] = why
        with redis_errors("writing the copy's requests"):
            out = self.target.pipeline(transaction=False)
            for q, mapping in req.items():
                t = self.tkeys[q]
                out.hset(t.req, mapping=mapping)
                for key, rows in ((t.delayed, delayed), (t.dead, dead)):
                    if rows.get(q):
                        out.zadd(key, rows[q])
                for key, fields in ((t.err, err), (t.deferrals, defers)):
                    if fields.get(q):
                        out.hset(key, mapping=fields[q])
            out.execute()

    def copy_pairs(self, target: Any, pairs: Sequence[tuple[bytes, bytes]]) -> int:
        """:func:`copy_pairs` from the source, its bytes counted in :attr:`size`."""
        size = copy_pairs(self.src.client, target, pairs, self.batch)
        self.size += size
        self.restored += len(pairs)
        return size

    def _due(self, rank: int) -> float:
        """The due time that promotes a ready request so that it is served ``rank``-th
        in its queue (see :data:`_FRONT_BASE`)."""
        return _FRONT_BASE - rank if self.front else _APPEND_BASE + rank

    def write_stats(self, before_stats: list[dict[bytes, bytes]], before: Counts) -> None:
        """Counters: the source's sums in partition 0, ``accepted`` per partition as it
        holds, ``seq`` per partition from its source partition's."""
        total: dict[bytes, int] = defaultdict(int)
        for raw in before_stats:
            for name, value in raw.items():
                number = stored_int(value)
                if number is not None and name.decode(errors="replace") not in (
                    SEQ_COUNTER,
                    "inflight",
                    "ready",
                ):
                    total[name] += number
        total[b"reclaimed"] += self.returned
        total[b"died"] += self.dead_lettered
        accepted = total.pop(b"accepted", 0)
        with redis_errors("writing the copy's counters"):
            pipe = self.target.pipeline(transaction=False)
            for q, keys in enumerate(self.tkeys):
                seq = stored_int(before_stats[q % self.ps].get(b"seq")) or 0
                mine = {b"seq": seq, b"accepted": self.placed[q]}
                if q == 0:
                    mine.update(total)
                    mine[b"accepted"] = accepted - sum(self.placed[1:])
                pipe.hset(keys.stats, mapping=mine)
            pipe.execute()

    def promote(self) -> None:
        assert self.dst is not None
        with redis_errors("placing the copy's ready requests"):
            while any(self.dst.maintain()):
                pass

    def keep_priority_order(self, plan: _Plan) -> None:
        """Strict priority: the promotion queued every request as served first among its
        priority (its push sequence unknown there); give each its source score back, so
        that equal priorities are served in push order as in the source."""
        if not self.priority:
            return
        for key in plan.queues:
            _tag, part, tail = _split_name(key)
            site = tail.split(":", 1)[1] if part == "pq" else None
            with redis_errors("reading the source's ready queues"):
                if self.src.client.type(key) != b"zset":
                    continue
                rows = self.src.client.zrange(key, 0, -1, withscores=True)
            per: dict[int, dict[bytes, float]] = defaultdict(dict)
            for rid, score in rows:
                q = partition_of(site, self.pt) if site is not None else self.homes.get(rid)
                if q is not None:
                    per[q][rid] = score
            with redis_errors("writing the copy's ready queues"):
                pipe = self.target.pipeline(transaction=False)
                for q, scores in per.items():
                    pipe.zadd(_renamed(key, self.tkeys[q].tag), scores, xx=True)
                pipe.execute()

    def register(self) -> None:
        with redis_errors("adding the crawl to the target's registry"):
            self.target.sadd(crawl_registry(self.anchor.prefix), self.src.crawl)


def _held_mark(body: bytes) -> bytes:
    """A record's envelope part with its slot mark back to ``K`` (a request not in flight
    holds no slot to give back)."""
    return b"K" + body[1:] if body[:1] == b"k" else body


def verify_rehome(
    r: Rehome, dst: PartitionedFrontier, before: Counts, stats: dict[str, int]
) -> Counts:
    """Raise :class:`FrontierError` unless the copy's counts and counters are the
    source's with the in-flight requests given back."""
    after = dst.counts()
    promoted = before.delayed - after.delayed
    want = (
        before.accepted,
        before.filtered,
        before.done,
        before.dead + r.dead_lettered,
        before.ready + r.returned + promoted,
        0,
    )
    got = (after.accepted, after.filtered, after.done, after.dead, after.ready, after.in_flight)
    if got != want or promoted < 0 or not after.conserved:
        raise FrontierError(
            f"the re-homed copy's counts are {after}, not the source's {before} with "
            f"{r.returned} in flight back to ready and {r.dead_lettered} to dead; nothing "
            "is left in the target"
        )
    mine = dst.stats()
    for name in set(stats) | set(mine):
        if name in (SEQ_COUNTER, *GIVE_BACK_COUNTERS):
            continue
        if stats.get(name, 0) != mine.get(name, 0):
            raise FrontierError(
                f"the re-homed copy's counter {name} is {mine.get(name, 0)}, the source's "
                f"{stats.get(name, 0)}; nothing is left in the target"
            )
    return after


def copy_pairs(source: Any, target: Any, pairs: Sequence[tuple[bytes, bytes]], batch: int) -> int:
    """DUMP each key of ``source`` (once) and RESTORE it in ``target`` under each of its
    new names, its time to live kept (a key that expired meanwhile is skipped); returns
    the payload bytes restored."""
    from redcrawl.migrate_to import _restore_error

    names: dict[bytes, list[bytes]] = defaultdict(list)
    for old, new in pairs:
        names[old].append(new)
    olds = list(names)
    size = 0
    for start in range(0, len(olds), batch):
        chunk = olds[start : start + batch]
        with redis_errors("reading the source's keys (DUMP)"):
            pipe = source.pipeline(transaction=False)
            for old in chunk:
                pipe.pttl(old)
                pipe.dump(old)
            replies = pipe.execute()
        with redis_errors("writing the target's keys (RESTORE)"):
            out = target.pipeline(transaction=False)
            sent = []
            for i, old in enumerate(chunk):
                ttl, payload = replies[2 * i], replies[2 * i + 1]
                if payload is None or ttl == -2:
                    continue
                for new in names[old]:
                    out.restore(new, max(int(ttl), 0), payload)
                    sent.append(new)
                    size += len(payload)
            for new, reply in zip(sent, out.execute(raise_on_error=False), strict=True):
                if isinstance(reply, Exception):
                    raise _restore_error(target, new, reply)
    return size


def rehome_crawl(
    src: FrontierCore,
    target: Any,
    partitions: int,
    result: Any,
    *,
    replace: bool,
    force_expire: bool,
    delete_source: bool,
    dry_run: bool,
    batch: int,
    progress: Any,
) -> None:
    """:func:`redcrawl.migrate_to.copy_crawl` into ``partitions`` partitions (the module
    docstring); fills ``result`` (a :class:`~redcrawl.migrate_to.CopyResult`)."""
    from redcrawl.lock import CrawlLock
    from redcrawl.migrate_to import (
        LOCK_TTL,
        _delete,
        _delete_source,
        _layout_refusal,
        _part,
        _preflight,
        _stats,
        crawl_redis_keys,
        key_sets,
    )

    check_partitions(len(source_parts(src)), partitions)
    r = Rehome(src, target, partitions, batch, progress)
    result.rehome = r.info
    sets = target_key_sets(target, src.keys, partitions)
    existing = _preflight(
        src, target, result, force_expire=force_expire, replace=replace, target_keys=sets
    )
    refusal = _layout_refusal(src)  # (the copy's partitions get these settings' layout)
    if refusal is not None:
        raise LayoutMismatch(f"{refusal}; nothing was copied")
    todo, other = crawl_redis_keys(src.client, key_sets(src), progress=progress)
    result.skipped = [k.decode(errors="replace") for k in other]
    result.replaced = len(existing)
    plan = plan_keys(todo, src.crawl)
    for key in todo:
        result.parts[_part(key)] = result.parts.get(_part(key), 0) + 1
    if dry_run:
        result.keys = len(todo)
        return
    lock = CrawlLock(target, src.keys, "migrate", ttl=LOCK_TTL)
    if not lock.acquire():
        raise FrontierError(
            f"another copy into the target's crawl {src.crawl!r} is running (lock "
            f"{src.keys.lock('migrate')}); wait for it to end"
        )
    assert result.before is not None
    before = result.before
    stats = src.stats()
    raw_stats = [dict(src.client.hgetall(p.keys.stats)) for p in r.parts]
    try:
        if existing:
            _delete(target, existing, "deleting the target's crawl (--replace)")
        try:
            dst = r.open_target()
            r.write_crawl_wide(plan)
            lock.renew()
            r.write_requests()
            lock.renew()
            r.write_stats(raw_stats, before)
            if progress is not None:
                progress("placing ready requests", 0, 0)
            r.promote()
            r.keep_priority_order(plan)
            if src.counts() != before or src.stats() != stats:
                raise FrontierError(
                    f"crawl {src.crawl!r} changed in the source while it was copied: a "
                    "worker or a client still writes to it. Nothing is left in the "
                    "target: stop every worker (and feeder) of the crawl and run again"
                )
            result.after = verify_rehome(r, dst, before, stats)
            r.register()
        except BaseException:
            written, rest = crawl_redis_keys(target, sets)
            _delete(target, [*written, *rest], "removing the partial copy")
            raise
        result.returned, result.dead_lettered = r.returned, r.dead_lettered
        result.promoted = before.delayed - result.after.delayed
        result.keys = r.restored
        result.size = r.size
        result.copied = todo
        result.stats = _stats(src)
        if delete_source:
            _delete_source(src, result, progress)
    finally:
        if lock.acquired:
            lock.release()
