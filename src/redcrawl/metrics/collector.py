"""The Prometheus view of a :class:`~redcrawl.metrics.snapshot.Snapshot`:
:class:`RedisCollector`, a ``prometheus_client`` collector that reads Redis at scrape
time (docs/metrics.md lists every metric).

Workers add their counters to the crawl with each heartbeat
(:mod:`redcrawl.scrapy.counters`): fleet totals in the crawl's stats hash (pages, bytes,
errors by kind, the download latency histogram, items stored), per-worker counters in a
hash that expires with the worker (exported for live workers only). The ack step keeps
the enqueue -> DONE latency histogram in the stats hash (``frontier/lua/latency.lua``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from redcrawl.metrics.buckets import DOWNLOAD_BOUNDS_MS, ERROR_KINDS, LATENCY_BOUNDS_MS, STORED
from redcrawl.metrics.snapshot import CrawlSnapshot, Snapshot, SnapshotReader

__all__ = [
    "CONTENT_TYPE",
    "COUNTERS",
    "DOWNLOAD_BOUNDS_MS",
    "ERROR_KINDS",
    "LATENCY_BOUNDS_MS",
    "STATES",
    "RedisCollector",
    "families",
    "render",
]

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

DEFERRED = "deferred_"
"""Prefix of the crawl's stats fields counting deferrals by reason (``deferred_429``)."""

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
    "requests_orphaned": (
        "orphaned",
        "Leases a live worker did not hold, taken back (disown: acks undone by a failover).",
    ),
    "requests_died": ("died", "Requests dead-lettered (attempts used up, or unprocessable)."),
    "requests_requeued": ("requeued", "Dead requests requeued by an operator."),
    "items": ("items", "Items the workers' pipelines reported (add_stats)."),
    "pages": ("pages", "Responses the workers received (heartbeat counters)."),
    "response_bytes": ("bytes", "Bytes of the responses' bodies (heartbeat counters)."),
    "robots_disallowed": (
        "robots_disallowed",
        "Requests robots.txt disallowed: finished (done) without a fetch (heartbeat counters).",
    ),
}


def _histogram(
    fam: HistogramMetricFamily,
    labels: list[str],
    stats: dict[str, int],
    prefix: str,
    bounds: tuple[int, ...],
) -> None:
    """Add one crawl's histogram kept as non-cumulative ``<prefix>:<bound ms>`` fields,
    ``<prefix>:inf`` and ``<prefix>_sum`` (ms) to ``fam`` (seconds, cumulative)."""
    total, buckets = 0, []
    for b in bounds:
        total += stats.get(f"{prefix}:{b}", 0)
        buckets.append((f"{b / 1000:g}", float(total)))
    total += stats.get(f"{prefix}:inf", 0)
    buckets.append(("+Inf", float(total)))
    fam.add_metric(labels, buckets, stats.get(f"{prefix}_sum", 0) / 1000)


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
    lost = _g(
        "partitions_lost",
        "Partitions of a partitioned crawl that lost their state since it was created (a "
        "Redis master came back empty; `redcrawl accept-loss`); 0 for a crawl of one.",
        ["crawl"],
    )
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
    latency = HistogramMetricFamily(
        "redcrawl_request_latency_seconds",
        "Seconds from a request's first push to its ack (DONE), kept by the ack step "
        "for the whole fleet.",
        labels=["crawl"],
    )
    download = HistogramMetricFamily(
        "redcrawl_download_latency_seconds",
        "Seconds a download took (Scrapy's download_latency; heartbeat counters).",
        labels=["crawl"],
    )
    errors = CounterMetricFamily(
        "redcrawl_errors", "Failures by kind (heartbeat counters).", labels=["crawl", "kind"]
    )
    stored = CounterMetricFamily(
        "redcrawl_items_stored",
        "Items UpsertPipeline stored: inserted (a new key) or updated (a key "
        "stored before: a duplicate item).",
        labels=["crawl", "result"],
    )
    leasable = _g(
        "requests_leasable",
        "Ready requests that can be leased now (due; with politeness on open keys, "
        "estimated: docs/metrics.md). The scaling signal.",
        ["crawl"],
    )
    opened = _g(
        "politeness_keys_open",
        "Politeness keys with ready work that may be served now.",
        ["crawl"],
    )
    pol_ready = _g(
        "politeness_keys_ready",
        "Politeness keys with ready work (summed over tiers: a key with ready work in "
        "two tiers counts twice).",
        ["crawl"],
    )
    pol_blocked = _g(
        "politeness_keys_blocked",
        "Politeness keys blocked now after 429/503 responses (operators' blocks not counted).",
        ["crawl"],
    )
    deferrals = CounterMetricFamily(
        "redcrawl_politeness_deferrals",
        "Requests deferred by politeness (back to ready, no attempt spent), by reason "
        "(the HTTP status: 429, 503, ...).",
        labels=["crawl", "reason"],
    )
    waited = CounterMetricFamily(
        "redcrawl_politeness_wait_seconds",
        "Seconds keys with ready work spent closed by their politeness limits (delay, "
        "concurrency, block), summed over grants (docs/politeness.md).",
        labels=["crawl"],
    )
    wrate = _g(
        "worker_pages_per_second",
        "Pages per second over the worker's last heartbeat interval; live workers.",
        ["crawl", "worker"],
    )
    wsuccess = _g(
        "worker_success_ratio",
        "Share of the worker's pages that succeeded over its last heartbeat "
        "interval (status < 400, callback did not raise; download errors count as "
        "failures); live workers.",
        ["crawl", "worker"],
    )
    wpages = CounterMetricFamily(
        "redcrawl_worker_pages",
        "Pages the worker received; live workers.",
        labels=["crawl", "worker"],
    )
    held = _g(
        "worker_leases_held",
        "Leases the worker holds: lists, how many of the crawl's 50 leases with the "
        "oldest deadlines are its (a lease is one lease() call; a worker whose heartbeat "
        "stopped holds the oldest); streams, its pending entries. Listed workers only.",
        ["crawl", "worker"],
    )
    for c in snap.crawls:
        n = c.counts
        for worker, k in c.holding.items():
            held.add_metric([c.crawl, worker], k)
        _histogram(latency, [c.crawl], c.stats, "lat", LATENCY_BOUNDS_MS)
        _histogram(download, [c.crawl], c.stats, "dl", DOWNLOAD_BOUNDS_MS)
        for kind in ERROR_KINDS:
            errors.add_metric([c.crawl, kind], c.stats.get(f"err:{kind}", 0))
        for result in STORED:
            stored.add_metric([c.crawl, result], c.stats.get(f"stored:{result}", 0))
        leasable.add_metric([c.crawl], c.leasable)
        if c.open_keys is not None:
            opened.add_metric([c.crawl], c.open_keys)
        if c.keys_ready is not None:
            _politeness(c, pol_ready, pol_blocked, deferrals, waited)
        for worker, wc in c.worker_counters.items():
            if "pages_per_s" in wc:
                wrate.add_metric([c.crawl, worker], wc["pages_per_s"])
            if "success" in wc:
                wsuccess.add_metric([c.crawl, worker], wc["success"])
            wpages.add_metric([c.crawl, worker], wc.get("pages", 0))
        for state in STATES:
            requests.add_metric([c.crawl, state], getattr(n, state))
        for name, (stat, _doc) in COUNTERS.items():
            counters[name].add_metric([c.crawl], c.stats.get(stat, 0))
        for tier, ready in c.ready_by_tier.items():
            tiers.add_metric([c.crawl, tier], ready)
        paused.add_metric([c.crawl], int(c.paused))
        finished.add_metric([c.crawl], int(n.finished and not c.lost_partitions))
        lost.add_metric([c.crawl], c.lost_partitions)
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
        lost,
        known,
        alive,
        age,
        wup,
        spend,
        sage,
        latency,
        download,
        errors,
        stored,
        leasable,
        opened,
        pol_ready,
        pol_blocked,
        deferrals,
        waited,
        wrate,
        wsuccess,
        wpages,
        held,
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


def _politeness(
    c: CrawlSnapshot,
    ready: GaugeMetricFamily,
    blocked: GaugeMetricFamily,
    deferrals: CounterMetricFamily,
    waited: CounterMetricFamily,
) -> None:
    """The politeness series of a crawl with politeness (the counters from its stats
    hash: ``deferred_<reason>``, ``politeness_wait_ms``; 429 and 503 always, so their
    series exist before the first deferral)."""
    ready.add_metric([c.crawl], c.keys_ready or 0)
    if c.keys_blocked is not None:
        blocked.add_metric([c.crawl], c.keys_blocked)
    reasons = {"429": 0, "503": 0}
    for name, value in c.stats.items():
        if name.startswith(DEFERRED):
            reasons[name[len(DEFERRED) :]] = value
    for reason, value in sorted(reasons.items()):
        deferrals.add_metric([c.crawl, reason], value)
    waited.add_metric([c.crawl], c.stats.get("politeness_wait_ms", 0) / 1000)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"redcrawl_{name}", doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"redcrawl_{name}", doc, value=value)


class RedisCollector(Collector):
    """Reads one snapshot per scrape. Redis down: only ``redcrawl_up 0`` (and the scrape
    duration), so Prometheus keeps scraping and an alert on ``redcrawl_up`` can fire."""

    def __init__(
        self, reader: SnapshotReader, on_snapshot: Callable[[Snapshot], None] | None = None
    ) -> None:
        self.reader = reader
        self.on_snapshot = on_snapshot
        """Called with each snapshot read (e.g. to record the dashboard's history); its
        failures are logged, never fail the scrape."""

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        out: list[Metric] = []
        up = 1
        try:
            snap = self.reader.read()
            out = families(snap)
        except Exception as exc:  # a scrape must answer: report Redis as down
            log.warning("metrics: reading Redis failed: %s", exc)
            up = 0
        else:
            if self.on_snapshot is not None:
                try:
                    self.on_snapshot(snap)
                except Exception as exc:  # e.g. a read-only ACL user: the scrape goes on
                    log.warning("metrics: after the scrape: %s", exc)
        yield from out
        yield _gauge("up", "1 if the exporter could read Redis.", up)
        yield _gauge(
            "scrape_duration_seconds",
            "Seconds this scrape spent reading Redis.",
            time.perf_counter() - started,
        )

    def describe(self) -> list[Any]:
        return []  # no read at registration time


def render(reader: SnapshotReader, on_snapshot: Callable[[Snapshot], None] | None = None) -> bytes:
    """The Prometheus text exposition of one scrape (``on_snapshot``: see
    :class:`RedisCollector`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RedisCollector(reader, on_snapshot))
    return generate_latest(registry)
