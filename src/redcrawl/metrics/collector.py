"""The Prometheus view of a :class:`~redcrawl.metrics.snapshot.Snapshot`:
:class:`RedisCollector`, a ``prometheus_client`` collector that reads Redis at scrape
time (docs/metrics.md lists every metric).

Per-worker counters slot in later as more families built from the same snapshot: once
workers add their counters to the crawl with each heartbeat, the snapshot reads them for
its top-N workers in the same pipeline and :func:`families` turns them into
``redcrawl_worker_*_total{crawl,worker}`` series.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from redcrawl.metrics.snapshot import Snapshot, SnapshotReader

__all__ = ["CONTENT_TYPE", "COUNTERS", "STATES", "RedisCollector", "families", "render"]

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

STATES = ("ready", "delayed", "in_flight", "done", "dead")
"""The states of ``redcrawl_requests{state=...}``: the conservation law's terms."""

COUNTERS = {
    # metric (without redcrawl_ and _total) -> (stats field, help)
    "requests_accepted": ("accepted", "Requests accepted (new, not duplicates)."),
    "requests_filtered": ("filtered", "Requests filtered as duplicates by Redis."),
    "requests_filtered_local": (
        "filtered_local",
        "Requests filtered as duplicates inside the workers.",
    ),
    "requests_done": ("done", "Requests done (acked)."),
    "requests_retried": ("retried", "Failed attempts sent back to be retried."),
    "requests_reclaimed": ("reclaimed", "Leases reclaimed after their worker's heartbeat stopped."),
    "requests_died": ("died", "Requests dead-lettered (attempts used up, or unprocessable)."),
    "requests_requeued": ("requeued", "Dead requests requeued by an operator."),
    "items": ("items", "Items the workers' pipelines reported (add_stats)."),
}


def _g(name: str, doc: str, labels: list[str], unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(f"redcrawl_{name}", doc, labels=labels, unit=unit)


def families(snap: Snapshot) -> list[Metric]:
    """Every metric family of one snapshot."""
    requests = _g(
        "requests", "Requests by state (ready, delayed, in_flight, done, dead).", ["crawl", "state"]
    )
    counters = {
        name: CounterMetricFamily(f"redcrawl_{name}", doc, labels=["crawl"])
        for name, (_f, doc) in COUNTERS.items()
    }
    tiers = _g(
        "requests_ready_by_tier",
        "Ready requests per tier (lists: 0 is the highest "
        "priority; streams: high/low, summed over shards).",
        ["crawl", "tier"],
    )
    paused = _g("crawl_paused", "1 while the crawl is paused.", ["crawl"])
    finished = _g("crawl_finished", "1 when nothing is ready, delayed or in flight.", ["crawl"])
    known = _g(
        "workers",
        "Workers with a heartbeat entry (alive or not; a worker that "
        "closed cleanly removes its entry).",
        ["crawl"],
    )
    alive = _g("workers_alive", "Workers whose heartbeat deadline is ahead.", ["crawl"])
    age = _g(
        "worker_heartbeat_age_seconds",
        "Seconds since the worker's last heartbeat "
        "(estimated: now - (deadline - lease ttl)); top-N workers per crawl.",
        ["crawl", "worker"],
    )
    wup = _g(
        "worker_alive",
        "1 while the worker's heartbeat deadline is ahead; top-N workers per crawl.",
        ["crawl", "worker"],
    )
    spend = _g(
        "stream_pending",
        "Stream entries delivered and not yet acked (streams backend).",
        ["crawl", "shard", "stream"],
    )
    sage = _g(
        "stream_oldest_pending_age_seconds",
        "Seconds since the oldest pending entry of the stream was added (streams backend).",
        ["crawl", "shard", "stream"],
    )
    for c in snap.crawls:
        n = c.counts
        for state in STATES:
            requests.add_metric([c.crawl, state], getattr(n, state))
        for name, (stat, _doc) in COUNTERS.items():
            counters[name].add_metric([c.crawl], c.stats.get(stat, 0))
        for tier, ready in c.ready_by_tier.items():
            tiers.add_metric([c.crawl, tier], ready)
        paused.add_metric([c.crawl], int(c.paused))
        finished.add_metric([c.crawl], int(n.finished))
        known.add_metric([c.crawl], c.workers_known)
        alive.add_metric([c.crawl], c.workers_alive)
        for w in c.workers:
            age.add_metric([c.crawl, w.worker], w.age)
            wup.add_metric([c.crawl, w.worker], int(w.alive))
        for s in c.streams:
            spend.add_metric([c.crawl, str(s.shard), s.stream], s.pending)
            sage.add_metric([c.crawl, str(s.shard), s.stream], s.oldest_age)
    r = snap.redis
    redis_families: list[Metric] = (
        []
        if r is None
        else [
            _gauge("redis_memory_used_bytes", "Redis used_memory.", r.used_memory),
            _gauge("redis_memory_max_bytes", "Redis maxmemory (0: no limit).", r.maxmemory),
            _counter("redis_evicted_keys", "Keys Redis evicted (evicted_keys).", r.evicted_keys),
            _gauge("redis_connected_clients", "Redis connected_clients.", r.connected_clients),
            _gauge(
                "redis_rdb_last_bgsave_ok",
                "1 if Redis's last RDB save succeeded.",
                int(r.rdb_last_bgsave_ok),
            ),
            _gauge(
                "redis_rdb_last_save_timestamp_seconds",
                "When Redis last saved an RDB successfully (rdb_last_save_time).",
                r.rdb_last_save_time,
            ),
            _gauge("redis_aof_enabled", "1 if Redis's append-only file is on.", int(r.aof_enabled)),
            _gauge(
                "redis_aof_last_write_ok",
                "1 if Redis's last AOF write succeeded.",
                int(r.aof_last_write_ok),
            ),
        ]
    )
    return [
        requests,
        tiers,
        *counters.values(),
        paused,
        finished,
        known,
        alive,
        age,
        wup,
        spend,
        sage,
        *redis_families,
        _gauge(
            "crawls_left_out", "Crawls found but not exported (over the cap).", snap.crawls_left_out
        ),
        _gauge(
            "crawls_unreadable",
            "Crawls found whose state could not be read (e.g. "
            "corrupt counters; the exporter logs why).",
            snap.crawls_unreadable,
        ),
    ]


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"redcrawl_{name}", doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"redcrawl_{name}", doc, value=value)


class RedisCollector(Collector):
    """Reads one snapshot per scrape. Redis down: only ``redcrawl_up 0`` (and the scrape
    duration), so Prometheus keeps scraping and an alert on ``redcrawl_up`` can fire."""

    def __init__(self, reader: SnapshotReader) -> None:
        self.reader = reader

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        out: list[Metric] = []
        up = 1
        try:
            out = families(self.reader.read())
        except Exception as exc:  # a scrape must answer: report Redis as down
            log.warning("metrics: reading Redis failed: %s", exc)
            up = 0
        yield from out
        yield _gauge("up", "1 if the exporter could read Redis.", up)
        yield _gauge(
            "scrape_duration_seconds",
            "Seconds this scrape spent reading Redis.",
            time.perf_counter() - started,
        )

    def describe(self) -> list[Any]:
        return []  # no read at registration time


def render(reader: SnapshotReader) -> bytes:
    """The Prometheus text exposition of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RedisCollector(reader))
    return generate_latest(registry)
