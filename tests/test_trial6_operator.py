"""Trial 6: a stranger operating a fleet by the docs (README, deploy/README, docs/cli.md,
docs/api.md, docs/metrics.md). What it found, one test each."""

from __future__ import annotations

import hashlib

import redis
from prometheus_client.parser import text_string_to_metric_families

from redcrawl.codec import Envelope
from redcrawl.frontier import open_frontier
from redcrawl.metrics.collector import render
from redcrawl.metrics.snapshot import SnapshotReader
from redcrawl.settings import Settings


def _env(url: str) -> Envelope:
    return Envelope(url=url, fingerprint=hashlib.sha1(url.encode()).digest())


def _crawls_in(text: str) -> set[str]:
    return {
        s.labels["crawl"]
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "redcrawl_requests" and "crawl" in s.labels
    }


def test_a_purged_crawl_leaves_the_metrics(redis7_client: redis.Redis) -> None:
    """`DELETE /v1/crawls/shop2` (or `redcrawl purge`): the crawl is gone from `crawls`,
    `GET /v1/crawls` and the dashboard, but `/metrics`, the exporter and `watch` went on
    exporting it as zeros forever (a purge keeps its stats hash for the id counters, and
    the metrics' crawl list only checked that the hash exists); each scrape of `serve`'s
    /metrics also wrote a dashboard history key for it again."""
    settings = Settings(politeness=False)
    for name in ("kept", "gone"):
        open_frontier(redis7_client, settings, name).push([_env(f"http://a.example/{name}")])
    reader = SnapshotReader(redis7_client, settings)
    assert _crawls_in(render(reader).decode()) == {"kept", "gone"}
    open_frontier(redis7_client, settings, "gone").purge()
    assert _crawls_in(render(reader).decode()) == {"kept"}
    # a fresh reader (the registry path, and the SCAN path once the registry is dropped)
    assert _crawls_in(render(SnapshotReader(redis7_client, settings)).decode()) == {"kept"}
    redis7_client.delete("rc:crawls")
    assert _crawls_in(render(SnapshotReader(redis7_client, settings)).decode()) == {"kept"}
    # pushed to again, it is back
    open_frontier(redis7_client, settings, "gone").push([_env("http://a.example/again")])
    assert _crawls_in(render(reader).decode()) == {"kept", "gone"}
