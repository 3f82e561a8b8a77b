"""Observing crawls through Redis: one bounded snapshot read (:mod:`.snapshot`), its
Prometheus view (:mod:`.collector`), the watchdog's rules (:mod:`.rules`, :mod:`.watch`)
and ``redcrawl top`` (:mod:`.top`). Needs ``prometheus-client`` for the Prometheus view
only. See docs/metrics.md."""

from redcrawl.metrics.snapshot import (
    MAX_CRAWLS,
    SCAN_BUDGET,
    TOP_WORKERS,
    CrawlSnapshot,
    RedisInfo,
    Snapshot,
    SnapshotReader,
    StreamPending,
    WorkerBeat,
    read_snapshot,
)

__all__ = [
    "MAX_CRAWLS",
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
