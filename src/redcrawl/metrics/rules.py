"""The alert rules, evaluated on :class:`~redcrawl.metrics.snapshot.Snapshot` s (the
watchdog, ``redcrawl watch``). They mirror ``deploy/prometheus/alerts.yml`` rule by rule,
with the same thresholds (:class:`Thresholds`' defaults) and the same ``for`` semantics:
a condition must hold at every poll for ``for`` seconds before the alert fires; windows
("not shrinking over 15 minutes") compare with the newest poll at least that old, so a
rule with a window stays quiet until the watchdog has watched that long.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from redcrawl.metrics.snapshot import CrawlSnapshot, Snapshot

__all__ = ["RULES", "Finding", "History", "Rule", "Thresholds"]


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The numbers of the rules (alerts.yml has the defaults)."""

    backlog: int = 100_000
    """Ready requests over which a backlog that is not shrinking alerts."""
    backlog_window: float = 900.0
    backlog_for: float = 300.0
    heartbeat_lost: float = 60.0
    """Seconds since a worker's last heartbeat, while the crawl has leases out."""
    stall_window: float = 600.0
    """Ready work and live workers but nothing done for this long."""
    stall_for: float = 300.0
    dead_window: float = 600.0
    dead_for: float = 300.0
    memory_ratio: float = 0.8
    memory_for: float = 300.0
    pending_age: float = 180.0
    """Seconds since the oldest pending stream entry was added."""
    duplicate_ratio: float = 0.05
    """Share of the items stored (UpsertPipeline) that updated a stored one."""
    duplicate_window: float = 900.0
    duplicate_for: float = 300.0
    blocked_keys: int = 10
    """Politeness keys blocked after 429/503 at or over which (and at or over
    ``blocked_ratio`` of the keys with ready work) the crawl is being pushed back."""
    blocked_ratio: float = 0.5
    blocked_for: float = 900.0


Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Finding:
    """A rule's condition holding for some labels at one poll."""

    labels: Labels
    summary: str


class History:
    """The polls seen, for windows: (server time, snapshot), oldest first, kept for
    ``keep`` seconds."""

    def __init__(self, keep: float) -> None:
        self.keep = keep
        self.polls: deque[Snapshot] = deque()

    def add(self, snap: Snapshot) -> None:
        self.polls.append(snap)
        while len(self.polls) > 1 and self.polls[1].now <= snap.now - self.keep:
            self.polls.popleft()

    def crawl_at(self, crawl: str, before: float) -> CrawlSnapshot | None:
        """The crawl in the newest poll taken at or before ``before``, or None."""
        for snap in reversed(self.polls):
            if snap.now <= before:
                for c in snap.crawls:
                    if c.crawl == crawl:
                        return c
                return None
        return None


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    for_: float
    evaluate: Callable[[Snapshot, History, Thresholds], Iterator[Finding]]


def _crawl(c: CrawlSnapshot) -> Labels:
    return (("crawl", c.crawl),)


def backlog(snap: Snapshot, h: History, t: Thresholds) -> Iterator[Finding]:
    for c in snap.crawls:
        then = h.crawl_at(c.crawl, snap.now - t.backlog_window)
        if c.counts.ready > t.backlog and then is not None and c.counts.ready >= then.counts.ready:
            yield Finding(
                _crawl(c),
                f"{c.counts.ready:,} requests ready (over {t.backlog:,}) "
                f"and not shrinking ({then.counts.ready:,} "
                f"{t.backlog_window:.0f}s ago)",
            )


def heartbeat(snap: Snapshot, h: History, t: Thresholds) -> Iterator[Finding]:
    for c in snap.crawls:
        for w in c.workers:
            if w.age > t.heartbeat_lost and c.holding.get(w.worker):
                yield Finding(
                    (("crawl", c.crawl), ("worker", w.worker)),
                    f"worker {w.worker}: no heartbeat for {w.age:.0f}s while it holds "
                    f"leases ({c.counts.in_flight:,} requests in flight in the crawl)",
                )


def stalled(snap: Snapshot, h: History, t: Thresholds) -> Iterator[Finding]:
    for c in snap.crawls:
        then = h.crawl_at(c.crawl, snap.now - t.stall_window)
        if (
            c.counts.ready
            and c.workers_alive
            and then is not None
            and c.counts.done == then.counts.done
        ):
            yield Finding(
                _crawl(c),
                f"{c.counts.ready:,} ready, {c.workers_alive} live "
                f"worker(s), nothing done in {t.stall_window:.0f}s",
            )


def dead_growing(snap: Snapshot, h: History, t: Thresholds) -> Iterator[Finding]:
    for c in snap.crawls:
        then = h.crawl_at(c.crawl, snap.now - t.dead_window)
        if then is not None and c.died > then.died:
            yield Finding(
                _crawl(c),
                f"{c.died - then.died:,} requests dead-lettered in "
                f"{t.dead_window:.0f}s ({c.counts.dead:,} dead now)",
            )


def memory(snap: Snapshot, h: History, t: Thresholds) -> Iterator[Finding]:
    r = snap.redis
    if r is not None and r.maxmemory and r.used_memory > t.memory_ratio * r.maxmemory:
        yield Finding(
            (),
            f"Redis uses {r.used_memory:,} of {r.maxmemory:,} bytes of "
            f"maxmemory ({r.used_memory / r.maxmemory:.0%})",
        )


def pending_old(snap: Snapshot, h: History, t: Thresholds) -> Iterator[Finding]:
    for c in snap.crawls:
        for s in c.streams:
            if s.oldest_age > t.pending_age:
                yield Finding(
                    (("crawl", c.crawl), ("shard", str(s.shard)), ("stream", s.stream)),
                    f"oldest pending entry of shard {s.shard} ({s.stream}) is "
                    f"{s.oldest_age:.0f}s old ({s.pending:,} pending)",
                )


def duplicates(snap: Snapshot, h: History, t: Thresholds) -> Iterator[Finding]:
    for c in snap.crawls:
        then = h.crawl_at(c.crawl, snap.now - t.duplicate_window)
        if then is None:
            continue
        updated = c.stats.get("stored:updated", 0) - then.stats.get("stored:updated", 0)
        inserted = c.stats.get("stored:inserted", 0) - then.stats.get("stored:inserted", 0)
        if updated > 0 and updated > t.duplicate_ratio * (updated + inserted):
            yield Finding(
                _crawl(c),
                f"{updated:,} of {updated + inserted:,} items stored in "
                f"{t.duplicate_window:.0f}s were duplicates "
                f"({updated / (updated + inserted):.0%}, over {t.duplicate_ratio:.0%})",
            )


def politeness_blocked(snap: Snapshot, h: History, t: Thresholds) -> Iterator[Finding]:
    for c in snap.crawls:
        blocked, ready = c.keys_blocked, c.keys_ready
        if blocked is None or ready is None:
            continue
        if blocked >= t.blocked_keys and blocked >= t.blocked_ratio * ready:
            yield Finding(
                _crawl(c),
                f"{blocked:,} sites blocked after 429/503 responses "
                f"({ready:,} sites with ready work)",
            )


def partitions_lost(snap: Snapshot, h: History, t: Thresholds) -> Iterator[Finding]:
    for c in snap.crawls:
        if c.lost_partitions:
            yield Finding(
                _crawl(c),
                f"{c.lost_partitions} partition(s) lost their state (a Redis master came "
                "back empty): `redcrawl status` names them, `redcrawl accept-loss` goes on "
                "without them",
            )


RULES: tuple[tuple[str, Callable[[Thresholds], float], Callable[..., Iterator[Finding]]], ...] = (
    ("RedcrawlBacklogHigh", lambda t: t.backlog_for, backlog),
    ("RedcrawlWorkerHeartbeatLost", lambda t: 0.0, heartbeat),
    ("RedcrawlCrawlStalled", lambda t: t.stall_for, stalled),
    ("RedcrawlDeadLettersGrowing", lambda t: t.dead_for, dead_growing),
    ("RedcrawlRedisMemoryHigh", lambda t: t.memory_for, memory),
    ("RedcrawlStreamPendingOld", lambda t: 0.0, pending_old),
    ("RedcrawlDuplicateItemsHigh", lambda t: t.duplicate_for, duplicates),
    ("RedcrawlPolitenessBlocked", lambda t: t.blocked_for, politeness_blocked),
    ("RedcrawlPartitionsLost", lambda t: 0.0, partitions_lost),
)
"""(alert name, its ``for`` seconds, its condition): the rules of alerts.yml."""


def rules(t: Thresholds) -> list[Rule]:
    return [Rule(name, for_(t), fn) for name, for_, fn in RULES]


def window(t: Thresholds) -> float:
    """How long the watchdog keeps polls for its windows."""
    return max(t.backlog_window, t.stall_window, t.dead_window, t.duplicate_window) + 60
