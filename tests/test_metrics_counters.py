"""Worker counters added to the crawl with each heartbeat, what ``/metrics`` makes of them
(per-worker rate and success, fleet totals, the two latency histograms, items stored),
the "leasable now" scaling signal, and the duplicate-item rule of ``redcrawl watch``."""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.errors import RedcrawlError
from redcrawl.frontier import FrontierCore, open_frontier
from redcrawl.metrics.collector import render
from redcrawl.metrics.rules import Thresholds
from redcrawl.metrics.snapshot import SnapshotReader
from redcrawl.metrics.watch import Watchdog
from redcrawl.scrapy.counters import WorkerCounters
from redcrawl.settings import Settings

from .conftest import Backend, RedisServer, _free_port
from .test_metrics import samples, value
from .test_watch import Sink


def env(url: str) -> Envelope:
    return Envelope(url=url, fingerprint=hashlib.sha1(url.encode()).digest())


def lists(client: redis.Redis, crawl: str = "c", **settings: object) -> FrontierCore:
    return open_frontier(client, Settings(backend="lists", **settings), crawl)  # type: ignore[arg-type]


class Ticks:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_heartbeat_adds_the_workers_counters_in_one_call(redis7_client: redis.Redis) -> None:
    f = lists(redis7_client, politeness=False)
    ticks, exceptions = Ticks(), [0]
    counters = WorkerCounters(exceptions=lambda: exceptions[0], clock=ticks)
    f.heartbeat_counters = counters
    for status, latency in ((200, 0.04), (200, 0.3), (404, 0.2), (503, 70.0)):
        counters.response(status, 1000, latency)
    counters.callback_error(had_ok_response=True)
    counters.item()
    counters.stored(inserted=True)
    counters.stored(inserted=False)
    exceptions[0] = 2  # two download attempts failed
    ticks.t += 2.0
    before = redis7_client.info("commandstats")
    f.renew("w1", ttl=30)
    after = redis7_client.info("commandstats")
    # one MULTI: the heartbeat script, the counters, the worker's hash and its expiry
    assert after["cmdstat_multi"]["calls"] - before.get("cmdstat_multi", {"calls": 0})["calls"] == 1
    stats = f.stats()
    assert {k: v for k, v in stats.items() if k not in ("seq", "leases")} == {
        "pages": 4,
        "bytes": 4000,
        "dl:50": 1,
        "dl:250": 1,
        "dl:500": 1,
        "dl:inf": 1,
        "dl_sum": 40 + 300 + 200 + 70000,
        "err:http_4xx": 1,
        "err:http_5xx": 1,
        "err:callback": 1,
        "err:download": 2,
        "stored:inserted": 1,
        "stored:updated": 1,
    }
    raw: dict[bytes, bytes] = redis7_client.hgetall(f.keys.worker_counters("w1"))  # type: ignore[assignment]
    own = {k.decode(): v.decode() for k, v in raw.items()}
    # 4 pages, 2 of them ok but one of those raised in its callback; 2 downloads failed
    assert own == {
        "pages": "4",
        "bytes": "4000",
        "ok": "1",
        "failed": "5",
        "items": "1",
        "pages_per_s": "2.000",
        "success": f"{1 / 6:.4f}",
    }
    assert 0 < redis7_client.pttl(f.keys.worker_counters("w1")) <= 30_000
    f.renew("w1", ttl=30)  # nothing new: the totals stay
    assert f.stats()["pages"] == 4

    text = render(SnapshotReader(redis7_client, Settings())).decode()
    found = samples(text)
    assert value(found, "redcrawl_pages_total", crawl="c") == 4
    assert value(found, "redcrawl_response_bytes_total", crawl="c") == 4000
    assert value(found, "redcrawl_errors_total", crawl="c", kind="download") == 2
    assert value(found, "redcrawl_items_stored_total", crawl="c", result="updated") == 1
    assert value(found, "redcrawl_download_latency_seconds_bucket", crawl="c", le="0.05") == 1
    assert value(found, "redcrawl_download_latency_seconds_bucket", crawl="c", le="60") == 3
    assert value(found, "redcrawl_download_latency_seconds_count", crawl="c") == 4
    assert value(found, "redcrawl_download_latency_seconds_sum", crawl="c") == 70.54
    # the second heartbeat came 0 s after the first on the worker's clock: no pages
    assert value(found, "redcrawl_worker_pages_per_second", crawl="c", worker="w1") == 0
    assert value(found, "redcrawl_worker_pages_total", crawl="c", worker="w1") == 4


def test_a_failed_heartbeat_keeps_its_counts_for_the_next(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    f = lists(redis7_client, politeness=False)
    counters = WorkerCounters()
    f.heartbeat_counters = counters
    counters.response(200, 10, 0.1)
    good = f.client
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    f.client = redis.Redis(port=port, socket_connect_timeout=0.2)
    with pytest.raises(RedcrawlError):
        f.renew("w1")
    f.client = good
    counters.response(200, 10, 0.1)
    f.renew("w1")
    assert f.stats()["pages"] == 2


def test_a_heartbeat_redis_ran_but_refused_is_not_counted_twice(
    redis7_client: redis.Redis,
) -> None:
    f = lists(redis7_client, politeness=False)
    counters = WorkerCounters()
    f.heartbeat_counters = counters
    counters.response(200, 10, 0.1)
    redis7_client.set(f.keys.workers, "not a hash")  # the heartbeat script refuses
    with pytest.raises(RedcrawlError, match="crawl state damaged"):
        f.renew("w1")
    redis7_client.delete(f.keys.workers)
    f.renew("w1")
    assert f.stats()["pages"] == 1  # the counts went in with the refused call, once


def test_only_live_workers_are_exported_one_by_one(redis7_client: redis.Redis) -> None:
    f = lists(redis7_client, politeness=False)
    for w in ("alive", "gone"):
        c = WorkerCounters()
        c.response(200, 1, 0.1)
        f.renew_counting(w, c, ttl=30 if w == "alive" else 0.05)
    time.sleep(0.1)
    found = samples(render(SnapshotReader(redis7_client, Settings())).decode())
    rates = {
        dict(labels)["worker"]
        for (name, labels), _v in found.items()
        if name == "redcrawl_worker_pages_per_second"
    }
    assert rates == {"alive"}
    assert value(found, "redcrawl_pages_total", crawl="c") == 2  # the dead one's stay


def test_request_latency_histogram_is_exported_in_seconds(redis7_client: redis.Redis) -> None:
    f = lists(redis7_client, politeness=False)
    f.push([env(f"http://h.example/{i}") for i in range(3)])
    f.ack(f.lease("w", 3))
    found = samples(render(SnapshotReader(redis7_client, Settings())).decode())
    assert value(found, "redcrawl_request_latency_seconds_count", crawl="c") == 3
    assert value(found, "redcrawl_request_latency_seconds_bucket", crawl="c", le="0.1") == 3
    assert value(found, "redcrawl_request_latency_seconds_bucket", crawl="c", le="+Inf") == 3
    assert value(found, "redcrawl_request_latency_seconds_sum", crawl="c") < 1


# --- leasable now -------------------------------------------------------------------------


def leasable(client: redis.Redis) -> tuple[float, float | None]:
    found = samples(render(SnapshotReader(client, Settings())).decode())
    opened = found.get(("redcrawl_politeness_keys_open", (("crawl", "c"),)))
    return value(found, "redcrawl_requests_leasable", crawl="c"), opened


def test_leasable_without_politeness_is_the_ready_work(redis7_client: redis.Redis) -> None:
    f = lists(redis7_client, politeness=False, retry_backoff=60.0, max_attempts=3)
    f.push([env(f"http://h.example/{i}") for i in range(10)])
    f.nack(f.lease("w", 1)[0], "later")  # DELAYED for a minute: not leasable
    assert leasable(redis7_client) == (9, None)
    f.pause()
    assert leasable(redis7_client) == (0, None)


def test_leasable_with_politeness_counts_what_open_sites_may_be_granted(
    redis7_client: redis.Redis,
) -> None:
    # a delay: one grant per site at a time; three sites, one of them just served
    f = lists(redis7_client, politeness=True, politeness_delay=60.0)
    f.push([env(f"http://h{i % 3}.example/{i}") for i in range(30)])
    assert f.counts().ready == 30
    assert len(f.lease("w", 10)) == 3  # one per site: each site waits a minute now
    assert leasable(redis7_client) == (0, 0)
    redis7_client.flushall()
    g = lists(redis7_client, politeness=True, politeness_delay=0.0, politeness_concurrency=4)
    g.push([env(f"http://h{i % 3}.example/{i}") for i in range(30)])
    # no delay: up to the concurrency (4) of each of the 3 open sites
    assert leasable(redis7_client) == (12, 3)


def test_leasable_estimate_is_scaled_from_a_bounded_sample(redis7_client: redis.Redis) -> None:
    f = lists(redis7_client, politeness=True, politeness_delay=1.0)
    f.push([env(f"http://h{i}.example/") for i in range(300)])
    reader = SnapshotReader(redis7_client, Settings())
    snap = reader.read()
    assert snap.crawls[0].open_keys == 300
    assert snap.crawls[0].leasable == 300  # one each (a delay), scaled from 20 per tier


# --- the duplicate-item rule of redcrawl watch -----------------------------------------------


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink(_free_port()).start()
    yield s
    s.stop()


def test_duplicate_items_over_5_percent_fire_and_under_do_not(
    redis7_client: redis.Redis, sink: Sink
) -> None:
    dupes, clean = lists(redis7_client, "dupes"), lists(redis7_client, "clean")
    for f in (dupes, clean):
        f.push([env("http://h.example/")])
    reader = SnapshotReader(redis7_client, Settings())
    d = Watchdog(
        reader,
        sink.url,
        thresholds=Thresholds(duplicate_window=0.3, duplicate_for=0.0),
        timeout=2,
    )
    d.poll()
    time.sleep(0.35)
    dupes.add_stats(**{"stored:inserted": 100, "stored:updated": 10})
    clean.add_stats(**{"stored:inserted": 100, "stored:updated": 1})
    d.poll()
    assert sink.seen() == [("firing", "RedcrawlDuplicateItemsHigh", {"crawl": "dupes"})]
    assert "10 of 110 items" in sink.bodies[0]["text"]


# --- a real Scrapy worker ----------------------------------------------------------------


def test_a_scrapy_worker_leaves_its_counters_in_the_crawl(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    from redcrawl.demo import ShopSite

    from .scrapy_projects import outcomes_spider as oc
    from .scrapy_projects.harness import frontier, run_spider
    from .test_scheduler import OUTCOMES, closed_port

    with ShopSite(OUTCOMES) as site:
        run_spider(
            "outcomes_spider.py",
            tmp_path,
            redis_url=redis7.url,
            crawl="counted",
            settings={"REDCRAWL_MAX_ATTEMPTS": 2},
            args={"url": site.url, "dead": closed_port()},
        ).ok()
        hits = site.hits()
    f = frontier(redis7_client, "counted")
    stats, c = f.stats(), f.counts()
    assert c.finished
    # every response that reached the spider, with its download time and size
    assert stats["pages"] == sum(v for k, v in stats.items() if k.startswith("dl:"))
    assert stats["pages"] >= c.done - 1  # the dropped request was never downloaded
    assert stats["bytes"] > 0
    assert stats["err:callback"] == hits[oc.BOOM] == 2
    assert stats["err:http_5xx"] >= 2  # POISON, twice delivered
    assert stats["err:http_4xx"] >= 1  # MISSING
    assert stats["err:download"] >= 2  # the closed port, every attempt
    # the latency histogram counted every ack
    assert sum(v for k, v in stats.items() if k.startswith("lat:")) == c.done


# --- the dashboard's history, kept by /metrics --------------------------------------------


def test_a_scrape_records_the_minute_of_the_dashboard_history(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    import httpx

    from redcrawl.keys import CrawlKeys

    from .apikit import AUTH_READ, ApiServer, api_settings

    f = lists(redis7_client, politeness=False)
    f.push([env(f"http://h.example/{i}") for i in range(4)])
    f.ack(f.lease("w", 1))
    server = ApiServer(api_settings(redis7.url), redis7_client)
    try:
        for _ in range(2):
            assert httpx.get(f"{server.url}/metrics", headers=AUTH_READ).status_code == 200
    finally:
        server.stop()
    key = CrawlKeys("c").history
    stored: list[bytes] = redis7_client.zrange(key, 0, -1)  # type: ignore[assignment]
    members = [m.decode() for m in stored]
    minute = int(f.server_time()) // 60
    assert len(members) == 1 and members[0].split(":")[1:] == ["1", "4"]
    assert int(members[0].split(":")[0]) in (minute - 1, minute)
    assert 0 < redis7_client.ttl(key) <= 2 * 3600


@pytest.mark.parametrize("backend", ["lists", "streams"])
def test_lost_heartbeat_fires_only_for_a_worker_that_holds_leases(
    redis7_client: redis.Redis, sink: Sink, backend: str
) -> None:
    settings = Settings(backend=cast(Backend, backend), politeness=False)
    f = open_frontier(redis7_client, settings, "c")
    f.push([env(f"http://h.example/{i}") for i in range(10)])
    f.lease("gone", 2, ttl=1.0)  # its heartbeat stops now, its leases stay
    f.renew("quiet", ttl=1.0)  # stops too, holding nothing
    f.lease("busy", 2, ttl=60)  # the crawl has requests in flight all along
    d = Watchdog(
        SnapshotReader(redis7_client, Settings(lease_ttl=1.0)),
        sink.url,
        thresholds=Thresholds(heartbeat_lost=0.5),
        timeout=2,
    )
    d.poll()
    assert sink.seen() == []
    time.sleep(0.7)
    d.poll()
    assert sink.seen() == [
        ("firing", "RedcrawlWorkerHeartbeatLost", {"crawl": "c", "worker": "gone"})
    ]
    found = samples(render(SnapshotReader(redis7_client, Settings())).decode())
    held = {
        dict(labels)["worker"]: v
        for (name, labels), v in found.items()
        if name == "redcrawl_worker_leases_held"
    }
    assert set(held) == {"gone", "busy"}
    assert held["gone"] == (1 if backend == "lists" else 2)  # one lease call; 2 entries


# --- politeness -------------------------------------------------------------------------


def test_politeness_gauges_and_counters(redis7_client: redis.Redis) -> None:
    f = lists(redis7_client, politeness=True, politeness_delay=0.0, politeness_concurrency=1)
    f.push([env(f"http://h{i % 4}.example/{i}") for i in range(12)])
    leased = f.lease("w", 10)
    assert len(leased) == 4  # one per site: each is full now
    by_host = {lease.envelope.url.split("/")[2]: lease for lease in leased}
    assert f.defer(by_host["h0.example"], "429", retry_after=600) == "deferred"
    assert f.defer(by_host["h1.example"], "503", retry_after=600) == "deferred"
    assert f.defer(by_host["h2.example"], "429", retry_after=600) == "deferred"
    found = samples(render(SnapshotReader(redis7_client, Settings())).decode())
    assert value(found, "redcrawl_politeness_keys_ready", crawl="c") == 4
    assert value(found, "redcrawl_politeness_keys_open", crawl="c") == 0
    assert value(found, "redcrawl_politeness_keys_blocked", crawl="c") == 3
    assert value(found, "redcrawl_politeness_deferrals_total", crawl="c", reason="429") == 2
    assert value(found, "redcrawl_politeness_deferrals_total", crawl="c", reason="503") == 1
    assert value(found, "redcrawl_politeness_wait_seconds_total", crawl="c") >= 0
    # the wait: counted in seconds from the stats hash's milliseconds
    redis7_client.hset(f.keys.stats, "politeness_wait_ms", 2500)
    found = samples(render(SnapshotReader(redis7_client, Settings())).decode())
    assert value(found, "redcrawl_politeness_wait_seconds_total", crawl="c") == 2.5
    assert f.politeness_stats()["blocked"] == 3  # the frontier's own count agrees


def test_no_politeness_series_without_politeness(redis7_client: redis.Redis) -> None:
    f = lists(redis7_client, politeness=False)
    f.push([env("http://h.example/")])
    text = render(SnapshotReader(redis7_client, Settings())).decode()
    assert 'redcrawl_requests{crawl="c"' in text
    assert "redcrawl_politeness_keys_ready{" not in text
    assert "redcrawl_politeness_deferrals_total{" not in text


def test_a_polite_scrape_costs_the_same_at_100_and_at_20000_requests(
    redis7_client: redis.Redis,
) -> None:
    from .test_metrics import _scrape_cost, fill

    f = lists(redis7_client, politeness=True, politeness_delay=0.0, politeness_concurrency=2)
    fill(f, 100)  # 50 sites: the open sample (20 per tier) is full already
    f.defer(f.lease("w1", 2)[0], "429", retry_after=600)  # one site blocked, one in flight
    reader = SnapshotReader(redis7_client, Settings())
    small = _scrape_cost(redis7_client, reader)
    fill(f, 20_000, start=100)
    f.ack(f.lease("w1", 50)[:30])
    big = _scrape_cost(redis7_client, reader)
    assert big == small, (small, big)
    # politeness adds per tier a ZCOUNT, a ZRANGEBYSCORE and a ZCARD, one ZCOUNT of the
    # blocked sites, and the sampled queues' lengths (20 per tier at most)
    assert small <= 21 + 3 * 3 + 1 + 20 * 3, small
    print(f"politeness: {small} Redis commands per scrape at 100 and 20,000 requests")


def _blocked_sites(f: FrontierCore, blocked: int, sites: int) -> None:
    """``sites`` sites with ready work, ``blocked`` of them blocked after a 429."""
    f.push([env(f"http://s{i}.example/{j}") for i in range(sites) for j in range(2)])
    held = {lease.envelope.url.split("/")[2]: lease for lease in f.lease("w", sites)}
    assert len(held) == sites
    for i in range(blocked):
        assert f.defer(held[f"s{i}.example"], "429", retry_after=600) == "deferred"


def test_many_sites_blocked_fire_and_few_or_a_small_share_do_not(
    redis7_client: redis.Redis, sink: Sink
) -> None:
    polite = {"politeness": True, "politeness_delay": 0.0, "politeness_concurrency": 1}
    _blocked_sites(lists(redis7_client, "pushed", **polite), 12, 16)
    _blocked_sites(lists(redis7_client, "few", **polite), 5, 5)
    _blocked_sites(lists(redis7_client, "wide", **polite), 12, 40)
    reader = SnapshotReader(redis7_client, Settings())
    snap = reader.read()
    assert {c.crawl: (c.keys_blocked, c.keys_ready) for c in snap.crawls} == {
        "pushed": (12, 16),
        "few": (5, 5),
        "wide": (12, 40),
    }
    d = Watchdog(reader, sink.url, thresholds=Thresholds(blocked_for=0.0), timeout=2)
    d.poll()
    assert sink.seen() == [("firing", "RedcrawlPolitenessBlocked", {"crawl": "pushed"})]
    assert "12 sites blocked after 429/503 responses (16 sites" in sink.bodies[0]["text"]


def test_robots_disallowed_is_a_crawl_wide_counter_in_metrics_status_and_dashboard(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """Each worker adds the requests robots.txt disallowed to the crawl with its heartbeat:
    the sum over the fleet is in /metrics, `redcrawl status` and the dashboard."""
    import json

    from typer.testing import CliRunner

    from redcrawl.api.routes.dashboard import _counts_table
    from redcrawl.cli import app

    f = lists(redis7_client)
    f.push([env("http://a.test/1")])
    found = samples(render(SnapshotReader(redis7_client, Settings())).decode())
    assert value(found, "redcrawl_robots_disallowed_total", crawl="c") == 0
    for worker, n in (("w1", 2), ("w2", 3)):
        counters = WorkerCounters()
        for _ in range(n):
            counters.robots_disallowed()
        f.renew_counting(worker, counters, ttl=30)
    assert f.stats()["robots_disallowed"] == 5
    found = samples(render(SnapshotReader(redis7_client, Settings())).decode())
    assert value(found, "redcrawl_robots_disallowed_total", crawl="c") == 5
    result = CliRunner().invoke(
        app, ["status", "--redis-url", redis7.url, "--crawl", "c", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["robots_disallowed"] == 5
    result = CliRunner().invoke(app, ["status", "--redis-url", redis7.url, "--crawl", "c"])
    assert "robots.txt disallowed" in result.output and "5 (done, not fetched)" in result.output
    assert 'id="count-robots-disallowed">5<' in _counts_table(f.counts(), f.stats())
    assert "robots" not in _counts_table(f.counts(), {})  # none: no column
