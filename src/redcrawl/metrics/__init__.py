"""Observing crawls through Redis: one bounded snapshot read (:mod:`.snapshot`), its
Prometheus view (:mod:`.collector`), the watchdog's rules (:mod:`.rules`, :mod:`.watch`)
``redcrawl top`` (:mod:`.top`) and the hosts panel of ``top`` and the dashboard
(:mod:`.hosts_view`). Needs ``prometheus-client`` for the Prometheus view
only. See docs/metrics.md."""

from redcrawl.metrics.hosts_view import TOP_HOSTS, HostLine, HostsPanel, read_hosts
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
    "TOP_HOSTS",
    "TOP_WORKERS",
    "CrawlSnapshot",
    "HostLine",
    "HostsPanel",
    "RedisInfo",
    "Snapshot",
    "SnapshotReader",
    "StreamPending",
    "WorkerBeat",
    "read_hosts",
    "read_snapshot",
]
