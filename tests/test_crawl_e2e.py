"""End-to-end: real Scrapy worker processes on one frontier, crawling the local shop site.

- 3 workers crawl a ~2,000-page site; one is SIGKILLed mid-crawl. The crawl still
  finishes, every page is fetched, the SQLite table has exactly one row per product and
  the conservation law holds.
- ``redcrawl crawl`` stopped with SIGINT and run again resumes without fetching any page
  twice.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from redcrawl.demo.run import SPIDER, demo_worker_settings
from redcrawl.demo.site import ShopSite, SiteConfig
from redcrawl.frontier import ListsFrontier, open_frontier
from redcrawl.frontier.base import InflightInfo, parse_id
from redcrawl.settings import Settings
from redcrawl.workers import worker_command

from .conftest import RedisServer

ROOT = Path(__file__).resolve().parent.parent


def _worker(
    url: str,
    crawl: str,
    site: ShopSite,
    items_db: Path,
    name: str,
    log: Path,
    backend: str = "lists",
) -> subprocess.Popen[bytes]:
    """A `scrapy runspider` worker process; its log goes to ``log``."""
    cmd = worker_command(
        SPIDER,
        settings=[
            *demo_worker_settings(items_db),
            "REDCRAWL_LEASE_TTL=3",
            "REDCRAWL_RETRY_BACKOFF=0.1",
            "LOG_LEVEL=INFO",
        ],
        spider_args={"url": site.url},
    )
    env = {
        **os.environ,
        "REDCRAWL_REDIS_URL": url,
        "REDCRAWL_CRAWL": crawl,
        "REDCRAWL_WORKER_ID": name,
        "REDCRAWL_BACKEND": backend,
        "PYTHONPATH": str(ROOT / "src"),
    }  # this checkout's redcrawl
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=out, cwd=items_db.parent
        )


def _rows(db: Path) -> tuple[int, int]:
    with sqlite3.connect(db) as conn:
        total, distinct = conn.execute("SELECT COUNT(*), COUNT(DISTINCT key) FROM items").fetchone()
    return int(total), int(distinct)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lists", "streams"])
def test_three_workers_one_sigkilled_crawl_completes(
    redis7: RedisServer, tmp_path: Path, backend: str
) -> None:
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    crawl = "e2e-kill"
    frontier = open_frontier(client, Settings(backend=backend), crawl)  # type: ignore[arg-type]
    config = SiteConfig(
        products=1900,
        per_page=20,
        categories=10,
        error_every=97,
        throttle_every=89,
        slow_every=50,
        slow_delay=0.2,
    )
    items_db = tmp_path / "items.db"
    with ShopSite(config) as site:
        assert 1990 <= len(site.canonical_pages()) <= 2100
        procs = [
            _worker(redis7.url, crawl, site, items_db, f"w{i}", tmp_path / f"w{i}.log", backend)
            for i in range(3)
        ]
        victim = procs[1]
        deadline = time.monotonic() + 120
        # kill once a third of the crawl is done and the victim holds leases: frozen first
        # (SIGSTOP), so that what it holds can't change between the look and the kill
        held: list[InflightInfo] = []
        while not held:
            while frontier.counts().done < 700 or not any(
                x.worker.startswith("w1:") for x in frontier.inflight(1000)
            ):
                assert time.monotonic() < deadline, "no progress"
                assert victim.poll() is None, (tmp_path / "w1.log").read_text()[-3000:]
                time.sleep(0.05)
            victim.send_signal(signal.SIGSTOP)
            held = [x for x in frontier.inflight(1000) if x.worker.startswith("w1:")]
            if not held:
                victim.send_signal(signal.SIGCONT)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        for i, p in enumerate(procs):
            if p is not victim:
                assert p.wait(timeout=240) == 0, (tmp_path / f"w{i}.log").read_text()[-3000:]
        hits = site.hits()
        expected = site.canonical_pages()

    c = frontier.counts()
    assert c.finished and c.conserved, c
    assert c.dead == 0, frontier.dead()
    assert held, "the victim held nothing when killed"
    assert c.reclaimed >= len(held), "the killed worker's leases were not all reclaimed"
    assert expected <= set(hits), sorted(expected - set(hits))[:10]
    total, distinct = _rows(items_db)
    assert (total, distinct) == (config.products, config.products)
    # what the victim held was taken over and finished by the survivors
    for x in held:
        assert not client.hexists(frontier.keys.req, parse_id(x.id)), x


@pytest.mark.slow
def test_sigint_then_rerun_resumes_without_refetching(redis7: RedisServer, tmp_path: Path) -> None:
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    crawl = "e2e-resume"
    frontier = ListsFrontier(client, Settings(), crawl)
    config = SiteConfig(products=600, slow_every=3, slow_delay=0.05, tracking_params=True)
    items_db = tmp_path / "items.db"
    sets: list[str] = []
    for item in [*demo_worker_settings(items_db), "CONCURRENT_REQUESTS=4"]:
        sets += ["--set", item]
    env = {**os.environ, "REDCRAWL_REDIS_URL": redis7.url}
    with ShopSite(config) as site:
        cmd = [
            sys.executable,
            "-m",
            "redcrawl.cli",
            "crawl",
            str(SPIDER),
            "--workers",
            "2",
            "--crawl",
            crawl,
            "--no-progress",
            "--arg",
            f"url={site.url}",
            *sets,
        ]
        first = subprocess.Popen(
            cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 60
        while frontier.counts().done < 150:
            assert first.poll() is None, first.communicate()[0].decode()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        first.send_signal(signal.SIGINT)
        out = first.communicate(timeout=60)[0].decode()
        assert first.returncode == 130, out[-3000:]
        mid = frontier.counts()
        assert not mid.finished and mid.in_flight == 0 and mid.conserved, mid

        second = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, timeout=120)
        assert second.returncode == 0, second.stderr.decode()[-3000:]
        hits = site.hits()
        expected = site.canonical_pages()
    c = frontier.counts()
    assert c.finished and c.conserved and c.done >= len(expected), c
    assert set(hits) == expected
    twice = {path: n for path, n in hits.items() if n > 1}
    assert not twice, f"fetched more than once: {list(twice.items())[:10]}"
    assert _rows(items_db) == (config.products, config.products)
