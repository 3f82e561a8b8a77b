"""redcrawl's Scrapy scheduler, end to end: real Scrapy crawls in subprocesses (Twisted's
reactor can't restart in-process) on the demo shop site and a real Redis 7, each checked
on the frontier's state afterwards (counts, dead letters, crawl-wide stats) and on
Scrapy's stats and the site's hit counters.

The spiders live in tests/scrapy_projects/; ``rc_testkit.Report`` writes what each
process saw (stats, responses, dropped requests, open/close times) to a JSON file.
"""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from redcrawl.demo import ShopSite, SiteConfig
from redcrawl.frontier import FrontierCore
from redcrawl.frontier.final import read_final
from redcrawl.keys import FINAL_TTL, CrawlKeys
from tests.conftest import RedisServer
from tests.scrapy_projects import outcomes_spider as oc
from tests.scrapy_projects.harness import (
    Run,
    crawl_keys,
    finished_state,
    frontier,
    run_spider,
    start_spider,
    wait_for,
)

SMALL = SiteConfig(products=30, per_page=5, categories=3, tracking_params=False)
"""37 pages: home, 6 listing pages, 30 products; plain links (duplicates, no tracking)."""


@pytest.fixture
def small_site() -> Iterator[ShopSite]:
    with ShopSite(SMALL) as site:
        yield site


def once_each(site: ShopSite) -> dict[str, int]:
    return dict.fromkeys(site.canonical_pages(), 1)


def crawl_shop(
    site: ShopSite,
    tmp_path: Path,
    redis7: RedisServer,
    crawl: str,
    tag: str = "run",
    **settings: object,
) -> Run:
    return run_spider(
        "shop_spider.py",
        tmp_path,
        redis_url=redis7.url,
        crawl=crawl,
        tag=tag,
        settings=settings,
        args={"url": site.url + "/"},
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- 1. a small crawl -------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["lists", "streams"])
def test_small_site_crawl_fetches_every_page_once(
    small_site: ShopSite,
    tmp_path: Path,
    redis7: RedisServer,
    redis7_client: redis.Redis,
    backend: str,
) -> None:
    run = crawl_shop(small_site, tmp_path, redis7, "small", REDCRAWL_BACKEND=backend).ok()
    pages = SMALL.pages
    f = frontier(redis7_client, "small", backend=backend)

    assert small_site.hits() == once_each(small_site)
    c = f.counts()
    assert c.finished and c.conserved
    assert (c.accepted, c.done, c.dead, c.retried, c.reclaimed) == (pages, pages, 0, 0, 0)
    assert f.inflight() == []
    assert run.stats["redcrawl/acked"] == c.done
    assert run.stats["redcrawl/stored"] == pages
    assert "redcrawl/stale_acks" not in run.stats
    assert f.workers() == {}  # the worker signed off
    layout = redis7_client.hget(f.keys.control, "layout") or b""
    assert isinstance(layout, bytes)
    assert layout.startswith(b"streams/8/host " if backend == "streams" else b"fifo/host ")
    if backend == "streams":  # the streams were used, and emptied by the acks
        assert redis7_client.keys("rc:{small}:s:*")
        assert sum(redis7_client.xlen(k) for k in redis7_client.keys("rc:{small}:s:*")) == 0
    # the site links the same pages many times: the duplicates were filtered (and shown
    # as Scrapy's own dupefilter shows them)
    assert c.filtered + f.stats().get("filtered_local", 0) > 0
    assert run.stats["dupefilter/filtered"] > 0


MEDIUM = SiteConfig(products=150, per_page=10, categories=3, tracking_params=False)


@pytest.mark.parametrize("lookahead", [0, 2])
def test_lookahead_keeps_settles_on_their_way_and_every_page_once(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis, lookahead: int
) -> None:
    """With LOOKAHEAD, settle calls (store, ack, lease more) go out before the local
    buffer runs dry and are read later, in order, on their own connection; the crawl is
    the same as without: every page fetched once, everything acked."""
    with ShopSite(MEDIUM) as site:
        crawl = f"ahead{lookahead}"
        run = crawl_shop(
            site, tmp_path, redis7, crawl, REDCRAWL_LOOKAHEAD=lookahead, REDCRAWL_PREFETCH=4
        ).ok()
        assert site.hits() == once_each(site)
    c = frontier(redis7_client, crawl).counts()
    assert c.finished and c.conserved
    assert c.accepted == c.done == MEDIUM.pages and c.dead == 0
    assert run.stats["redcrawl/acked"] == c.done
    if lookahead:
        assert run.stats["redcrawl/lookahead_calls"] > 0
    else:
        assert "redcrawl/lookahead_calls" not in run.stats


# --- 2. duplicates ----------------------------------------------------------------------


def test_tracking_variants_are_one_page_with_canonicalize(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """With tracking links (utm_*, ref) and canonicalisation on, every page is fetched
    exactly once, and the variants were counted as filtered."""
    config = SiteConfig(products=30, per_page=5, categories=3, tracking_params=True)
    with ShopSite(config) as site:
        run = crawl_shop(
            site,
            tmp_path,
            redis7,
            "canon",
            REDCRAWL_CANONICALIZE="true",
            REDCRAWL_CANONICAL_DROP_PARAMS="utm_*,ref",
        ).ok()
        hits = site.hits()
        expected = once_each(site)
    # pages were reached through tracking links (the home page's featured products
    # are linked only that way), and fetched once all the same
    assert any("utm_" in url or "ref=" in url for url in run.urls)
    assert hits == expected
    f = frontier(redis7_client, "canon")
    c = f.counts()
    assert c.done == config.pages and c.finished and c.conserved and c.dead == 0
    assert c.filtered + f.stats().get("filtered_local", 0) > 0
    assert run.stats["redcrawl/filtered"] > 0


def test_project_request_fingerprinter_is_used(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """REQUEST_FINGERPRINTER_CLASS decides what a duplicate is (here: URLs that differ
    by tracking parameters are one page), as with Scrapy's own scheduler."""
    config = SiteConfig(products=30, per_page=5, categories=3, tracking_params=True)
    with ShopSite(config) as site:
        run = crawl_shop(
            site, tmp_path, redis7, "customfp", REQUEST_FINGERPRINTER_CLASS="custom_fp.NoTracking"
        ).ok()
        hits = site.hits()
        expected = once_each(site)
    assert any("utm_" in url or "ref=" in url for url in run.urls)
    assert hits == expected  # never a tracking variant of a page fetched before
    c = frontier(redis7_client, "customfp").counts()
    assert c.done == config.pages and c.finished and c.conserved
    assert run.stats["redcrawl/filtered"] > 0


# --- 3. outcomes ------------------------------------------------------------------------

OUTCOMES = SiteConfig(products=30, error_every=5, always_fail=(7,), tracking_params=False)


def test_outcomes(tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis) -> None:
    """Callback error and persistent 500 and download error -> DEAD after
    REDCRAWL_MAX_ATTEMPTS with the reason; 500-then-200 (Scrapy's own retry), 404 and
    IgnoreRequest -> done."""
    dead_port = closed_port()
    with ShopSite(OUTCOMES) as site:
        run = run_spider(
            "outcomes_spider.py",
            tmp_path,
            redis_url=redis7.url,
            crawl="outcomes",
            settings={"REDCRAWL_MAX_ATTEMPTS": 2},
            args={"url": site.url, "dead": dead_port},
        ).ok()
        hits = site.hits()
        base = site.url
    f = frontier(redis7_client, "outcomes")
    c = f.counts()
    assert c.finished and c.conserved

    dead = {d.url.removeprefix(base): d for d in f.dead()}
    unreachable = f"http://127.0.0.1:{dead_port}/unreachable"
    assert set(dead) == {oc.BOOM, oc.POISON, unreachable}, dead
    assert all(d.attempts == 2 for d in dead.values()), dead
    assert "callback error: ValueError" in dead[oc.BOOM].error
    assert "HTTP 500" in dead[oc.POISON].error
    assert "download error" in dead[unreachable].error
    assert "ConnectionRefused" in dead[unreachable].error
    assert c.dead == 3 and c.retried == 3
    assert run.stats["redcrawl/dead"] == 3 and run.stats["redcrawl/retried"] == 3

    # the callback ran once per delivery: two deliveries, then dead
    assert hits[oc.BOOM] == 2
    # Scrapy's own retries ran before redcrawl's (RETRY_TIMES=1)
    assert hits[oc.POISON] >= 2
    # 500 once, then 200 after Scrapy's own retry: done, not dead
    assert hits[oc.FLAKY] == 2
    assert [s for u, s, _ in run.report["responses"] if u.endswith(oc.FLAKY)] == [200]
    # 404: fetched once, done
    assert hits[oc.MISSING] == 1
    # IgnoreRequest from a downloader middleware: never fetched, done
    assert oc.DROPPED not in hits
    assert hits[oc.FINE] == 1
    # none of those was retried or dead-lettered
    for path in (oc.FLAKY, oc.MISSING, oc.DROPPED, oc.FINE):
        assert path not in dead
    assert run.stats["redcrawl/acked"] == c.done


def test_scrapy_retries_a_start_request(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    with ShopSite(OUTCOMES) as site:
        run = run_spider(
            "outcomes_spider.py",
            tmp_path,
            redis_url=redis7.url,
            crawl="startretry",
            settings={"REDCRAWL_MAX_ATTEMPTS": 2},
            args={"url": site.url, "start": f"{oc.FLAKY},{oc.POISON}"},
        ).ok()
        hits = site.hits()
        base = site.url
    assert run.report["dropped"] == []  # no retry refused by the scheduler
    # 500 once, then 200 after Scrapy's own retry
    assert hits[oc.FLAKY] == 2
    assert [s for u, s, _ in run.report["responses"] if u.endswith(oc.FLAKY)] == [200]
    # always 500: dead after the attempts
    assert [d.url for d in frontier(redis7_client, "startretry").dead()] == [base + oc.POISON]


class FlakySite:
    """A local HTTP server: ``/`` links to ``/a`` (200), ``/b`` (503 once, then 200) and
    ``/c`` (always 503); counts the hits per path."""

    def __init__(self) -> None:
        hits: dict[str, int] = {}
        self.hits = hits

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                n = hits[self.path] = hits.get(self.path, 0) + 1
                status = 503 if self.path == "/c" or (self.path == "/b" and n == 1) else 200
                body = (
                    b'<a href="/a">a</a><a href="/b">b</a><a href="/c">c</a>'
                    if self.path == "/"
                    else b"page"
                )
                self.send_response(status)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_request_retried_by_scrapy_is_one_request(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """Scrapy's RetryMiddleware makes a new request object for each retry: it is the same
    logical request, so it ends in one state (done or dead), counted once."""
    site = FlakySite()
    try:
        run = run_spider(
            "shop_spider.py",
            tmp_path,
            redis_url=redis7.url,
            crawl="flaky",
            # (503s retried by Scrapy, not deferred: tests/test_politeness_fleet.py)
            settings={
                "RETRY_TIMES": 1,
                "REDCRAWL_MAX_ATTEMPTS": 2,
                "REDCRAWL_DEFER_HTTP_CODES": "",
            },
            args={"url": site.url + "/"},
        ).ok()
    finally:
        site.close()
    # /b: 503 then 200 (Scrapy's retry); /c: 503 twice per delivery, two deliveries
    assert site.hits == {"/": 1, "/a": 1, "/b": 2, "/c": 4}
    f = frontier(redis7_client, "flaky")
    c = f.counts()
    assert c.finished and c.conserved
    assert (c.accepted, c.done, c.dead, c.retried) == (4, 3, 1, 1)
    (dead,) = f.dead()
    assert dead.url == site.url + "/c" and dead.attempts == 2 and "HTTP 503" in dead.error
    assert run.stats["redcrawl/acked"] == 3 and run.stats["redcrawl/dead"] == 1


# --- 4. enqueue_request's answer, unstorable meta -------------------------------------


def test_enqueue_request_answers(
    small_site: ShopSite, tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    run = run_spider(
        "enqueue_spider.py",
        tmp_path,
        redis_url=redis7.url,
        crawl="enqueue",
        args={"url": small_site.url},
    )
    base = small_site.url
    # called directly: True, then False for the same URL
    assert run.report["spider"]["direct"] == [True, False]
    # yielded twice: Scrapy got False for the second (request_dropped), and for the
    # unstorable request
    assert sorted(run.report["dropped"]) == [base + "/product/1", base + "/product/3"]
    # the unstorable request stops the crawl loudly: an error naming the key and the
    # request, reason unstorable_request, exit code 1 (never a silent drop)
    assert run.returncode == 1, run.tail()
    assert run.report["reason"] == "unstorable_request"
    assert run.stats["redcrawl/unstorable"] == 1
    errors = [line for line in run.stderr.splitlines() if "CRITICAL" in line]
    assert any("meta['obj']" in line and "/product/3" in line for line in errors), errors
    assert small_site.hits() == {"/": 1}
    # its parent was not acknowledged (it comes back, with its children, on the next
    # run); the other children are stored; nothing else was fetched
    f = frontier(redis7_client, "enqueue")
    c = f.counts()
    assert c.conserved and (c.accepted, c.done, c.ready, c.in_flight) == (4, 0, 4, 0)
    assert {p.url.removeprefix(base) for p in f.pending()} == {
        "/",
        "/product/1",
        "/product/2",
        "/product/4",
    }


# --- 5. resume ----------------------------------------------------------------------------


def test_second_run_of_a_finished_crawl_fetches_nothing(
    small_site: ShopSite, tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    crawl_shop(small_site, tmp_path, redis7, "again", tag="first").ok()
    before = frontier(redis7_client, "again").counts()
    small_site.reset_hits()

    second = crawl_shop(small_site, tmp_path, redis7, "again", tag="second").ok()
    assert small_site.hits() == {}  # the start URL is done: dont_filter didn't matter
    assert second.urls == []
    assert second.stats.get("redcrawl/filtered_remote") == 1
    assert second.stats.get("redcrawl/acked", 0) == 0
    after = frontier(redis7_client, "again").counts()
    assert (after.accepted, after.done) == (before.accepted, before.done)
    assert after.filtered == before.filtered + 1
    # "at once": closing took about as long as a crawl that fetches nothing can take
    assert second.report["closed_at"] - second.report["opened_at"] < 5
    # and it said why it fetched nothing
    hint = (
        f"crawl 'again' is finished: {before.done} done; use `redcrawl purge` or "
        "`--recrawl` to crawl again"
    )
    assert hint in second.stderr and "WARNING" in second.stderr
    assert hint not in crawl_shop(small_site, tmp_path, redis7, "fresh", tag="fresh").stderr


# --- 6. SCHEDULER_FLUSH_ON_START --------------------------------------------------------


def test_flush_on_start_restarts_a_finished_crawl_unless_a_worker_is_alive(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """Two finished crawls (without the flush their start URL is done and nothing is
    fetched: test_second_run_of_a_finished_crawl_fetches_nothing), each run by one worker
    with SCHEDULER_FLUSH_ON_START, side by side: "flush" starts again from scratch;
    "busy", where another worker's heartbeat is alive, is kept as it is."""
    with ShopSite(SMALL) as site_flush, ShopSite(SMALL) as site_busy:
        finished_state(redis7_client, "flush", site_flush.url + "/")
        finished_state(redis7_client, "busy", site_busy.url + "/")
        busy = frontier(redis7_client, "busy")
        busy.renew("other-worker", ttl=60)  # a live worker of this crawl
        workers = [
            start_spider(
                "shop_spider.py",
                tmp_path,
                redis_url=redis7.url,
                crawl=crawl,
                tag=crawl,
                settings={"SCHEDULER_FLUSH_ON_START": "True"},
                args={"url": site.url + "/"},
            )
            for crawl, site in (("flush", site_flush), ("busy", site_busy))
        ]
        run_flush, run_busy = (w.wait().ok() for w in workers)
        hits_flush, hits_busy = site_flush.hits(), site_busy.hits()
        expected = once_each(site_flush)

    assert "flushed crawl 'flush' on start" in run_flush.stderr
    assert hits_flush == expected
    c = frontier(redis7_client, "flush").counts()
    assert c.accepted == c.done == SMALL.pages  # counters started again from zero
    assert c.filtered == run_flush.stats.get("redcrawl/filtered_remote", 0)

    assert "not flushing: crawl already running (1 worker(s))" in run_busy.stderr
    assert "flushed crawl" not in run_busy.stderr
    assert hits_busy == {}  # the start URL is still done
    c = busy.counts()
    assert (c.accepted, c.done, c.filtered) == (1, 1, 1)
    assert set(busy.workers()) == {"other-worker"}


def test_flush_on_start_happens_once_for_workers_starting_together(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """Two workers started together with flush-on-start on a finished crawl: one of them
    flushes, the other joins the crawl it restarted; every page is fetched once."""
    config = SiteConfig(
        products=30, per_page=5, categories=3, tracking_params=False, slow_every=30, slow_delay=3
    )  # the crawl lasts > 3 s
    with ShopSite(config) as site:
        finished_state(redis7_client, "together", site.url + "/")
        workers = [
            start_spider(
                "shop_spider.py",
                tmp_path,
                redis_url=redis7.url,
                crawl="together",
                tag=f"w{i}",
                settings={"SCHEDULER_FLUSH_ON_START": "True"},
                args={"url": site.url + "/"},
            )
            for i in range(2)
        ]
        runs = [w.wait().ok() for w in workers]
        hits = site.hits()
        expected = dict.fromkeys(site.canonical_pages(), 1)
    logs = "".join(r.stderr for r in runs)
    assert logs.count("flushed crawl 'together' on start") == 1, logs[-3000:]
    assert logs.count("not flushing: crawl already running") == 1
    assert hits == expected
    c = frontier(redis7_client, "together").counts()
    assert c.accepted == c.done == config.pages and c.conserved
    # both opened on the crawl (the two log lines above); which of them fetched what
    # depends on lease timing: a worker leases a batch of its own children before the
    # other's next poll, and on a loaded machine (Scrapy 2.11's matrix run, load ~7) one
    # started after the other had leased everything, so neither must have leased
    assert sum(r.stats.get("redcrawl/acked", 0) for r in runs) == c.done


# --- 7. SCHEDULER_PERSIST = False ----------------------------------------------------------


def test_persist_false_purges_the_crawl_unless_another_worker_is_alive(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """SCHEDULER_PERSIST = False, two crawls side by side: "gone" (its only worker
    finishes it) is deleted; "kept" (another worker's heartbeat is alive) is kept."""
    frontier(redis7_client, "kept").renew("other-worker", ttl=60)
    with ShopSite(SMALL) as site_gone, ShopSite(SMALL) as site_kept:
        workers = [
            start_spider(
                "shop_spider.py",
                tmp_path,
                redis_url=redis7.url,
                crawl=crawl,
                tag=crawl,
                settings={"SCHEDULER_PERSIST": "False"},
                args={"url": site.url + "/"},
            )
            for crawl, site in (("gone", site_gone), ("kept", site_kept))
        ]
        for worker in workers:
            worker.wait().ok()
        assert site_gone.hits() == site_kept.hits() == once_each(site_gone)

    # purged: only the counters naming ids and lease tokens stay (so old leases stay stale),
    # and the finished crawl's counts for `redcrawl crawl`, which expire
    assert crawl_keys(redis7_client, "gone") == [b"rc:{gone}:final", b"rc:{gone}:stats"]
    assert 0 < redis7_client.ttl("rc:{gone}:final") <= FINAL_TTL
    final = read_final(redis7_client, CrawlKeys("gone"))
    assert final is not None and final[0].done == len(once_each(site_gone)) and final[0].finished
    assert set(redis7_client.hkeys("rc:{gone}:stats")) <= {b"seq", b"leases"}
    assert crawl_keys(redis7_client, "kept") != []
    kept = frontier(redis7_client, "kept")
    c = kept.counts()
    assert c.done == SMALL.pages and c.finished
    assert set(kept.workers()) == {"other-worker"}


# --- 8. global finishing -------------------------------------------------------------------


def test_idle_worker_waits_for_children_of_another_workers_slow_request(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """Worker A fetches the start page, then one slow page (4 s) whose callback yields 50
    more. Worker B starts while that page is in flight and nothing is ready: it must wait
    for the crawl (not its own queue) to finish, and fetch some of A's late children."""
    config = SiteConfig(products=60, slow_every=60, slow_delay=4, tracking_params=False)
    with (
        ShopSite(config) as site,
        start_spider(
            "fanout_spider.py",
            tmp_path,
            redis_url=redis7.url,
            crawl="global",
            tag="a",
            args={"url": site.url},
            # a slow consumer, so that B has work to take
            settings={"REDCRAWL_PREFETCH": 1, "CONCURRENT_REQUESTS": 1, "DOWNLOAD_DELAY": 0.2},
        ) as a,
    ):
        wait_for(lambda: site.hits().get("/product/60", 0) > 0, what="the slow page")
        f = frontier(redis7_client, "global")
        # acks are batched (flushed at the next lease or within a second): wait for the
        # start page's, then only the slow page is held and nothing is ready for B
        wait_for(lambda: f.counts().in_flight == 1, what="the start page's ack")
        c = f.counts()
        assert (c.ready, c.delayed, c.in_flight) == (0, 0, 1)
        with start_spider(
            "fanout_spider.py",
            tmp_path,
            redis_url=redis7.url,
            crawl="global",
            tag="b",
            args={"url": site.url, "start": "0"},
            settings={"REDCRAWL_POLL_INTERVAL": 0.1},
        ) as b:
            run_a, run_b = a.wait().ok(), b.wait().ok()
        hits = site.hits()
    slow_done = next(t for u, _, t in run_a.report["responses"] if u.endswith("/product/60"))
    assert run_b.report["opened_at"] < slow_done, "B opened too late to test anything"
    leaves = {f"/product/{i}" for i in range(1, 51)}
    assert hits == dict.fromkeys({"/", "/product/60", *leaves}, 1)
    b_paths = set(run_b.paths())
    assert b_paths and b_paths <= leaves  # B fetched some of A's late children...
    assert run_b.report["closed_at"] > slow_done  # ...and didn't quit before they existed
    c = f.counts()
    assert c.finished and c.conserved and c.done == 52 and c.reclaimed == 0
    assert run_a.stats["redcrawl/acked"] + run_b.stats["redcrawl/acked"] == 52


# --- 9. lease renewal ----------------------------------------------------------------------


def test_slow_download_keeps_its_lease(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """LEASE_TTL 1 s (heartbeat every 1/3 s), a download of 3 s: the heartbeat keeps
    the lease, the page is fetched once and nothing is reclaimed."""
    config = SiteConfig(products=60, slow_every=60, slow_delay=3, tracking_params=False)
    with ShopSite(config) as site:
        started = time.monotonic()
        run = run_spider(
            "fanout_spider.py",
            tmp_path,
            redis_url=redis7.url,
            crawl="lease",
            args={"url": site.url, "leaves": 0},
            settings={"REDCRAWL_LEASE_TTL": 1},
        ).ok()
        hits = site.hits()
    assert time.monotonic() - started > 3
    assert hits == {"/": 1, "/product/60": 1}
    f: FrontierCore = frontier(redis7_client, "lease")
    c = f.counts()
    assert c.reclaimed == 0 and c.done == 2 and c.finished and c.conserved
    assert run.stats["redcrawl/acked"] == 2
    assert "redcrawl/stale_acks" not in run.stats


# --- 10. the tail of a crawl --------------------------------------------------------------


def test_at_the_tail_a_worker_gives_back_what_it_cannot_start(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """Worker A (2 requests at a time, leasing ahead) finds the crawl's last 50 pages
    (slow: 0.5 s each) while worker B waits idle: A keeps only what it can start and
    gives the rest back, so B fetches most of them instead of waiting for A."""
    config = SiteConfig(products=60, slow_every=1, slow_delay=0.5, tracking_params=False)
    f = frontier(redis7_client, "tail")
    with (
        ShopSite(config) as site,
        start_spider(
            "fanout_spider.py",
            tmp_path,
            redis_url=redis7.url,
            crawl="tail",
            tag="b",
            args={"url": site.url, "start": "0"},
            # B waits for the crawl to start (it has no start URL of its own)
            settings={"REDCRAWL_POLL_INTERVAL": 0.1, "REDCRAWL_IDLE_BEFORE_CLOSE": 5},
        ) as b,
    ):
        wait_for(lambda: len(f.workers()) == 1, what="B to join the crawl")
        with start_spider(
            "fanout_spider.py",
            tmp_path,
            redis_url=redis7.url,
            crawl="tail",
            tag="a",
            args={"url": site.url},
            settings={"CONCURRENT_REQUESTS": 2},
        ) as a:
            run_a, run_b = a.wait().ok(), b.wait().ok()
        hits = site.hits()
    leaves = {f"/product/{i}" for i in range(1, 51)}
    assert hits == dict.fromkeys({"/", "/product/60", *leaves}, 1)
    by_b = set(run_b.paths()) & leaves
    by_a = set(run_a.paths()) & leaves
    print(f"\nleaves fetched by A (2 at a time): {len(by_a)}, by B: {len(by_b)}")
    assert len(by_b) > len(by_a)
    c = frontier(redis7_client, "tail").counts()
    assert c.finished and c.conserved and c.done == 52
    # (whether A gave leases back or never took more than it could start depends on
    # timing: both are the tail rule; the split of the work above is what counts)


def test_the_redis_password_is_not_written_in_the_worker_log(
    small_site: ShopSite, tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """The scheduler's "worker ... on crawl ..." line named the URL with its password
    (every worker's log, and `redcrawl crawl`'s log files)."""
    user = "rc_log_user"
    redis7_client.execute_command(
        "ACL", "SETUSER", user, "reset", "on", ">s3cret-in-url", "~*", "&*", "+@all"
    )
    try:
        url = redis7.url.replace("redis://", f"redis://{user}:s3cret-in-url@")
        run = run_spider(
            "shop_spider.py",
            tmp_path,
            redis_url=url,
            crawl="pw",
            settings={"LOG_LEVEL": "INFO"},
            args={"url": small_site.url + "/"},
        ).ok()
    finally:
        redis7_client.execute_command("ACL", "DELUSER", user)
    assert "redcrawl: worker " in run.stderr
    assert "s3cret-in-url" not in run.stderr
    assert f"{user}:***@" in run.stderr
