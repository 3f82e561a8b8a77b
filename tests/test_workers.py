"""``redcrawl crawl``'s worker processes (:mod:`redcrawl.workers`): output always drained
to per-worker logs, signals forwarded (a second one kills), crashed workers restarted.

The crawl tests run the real command (``python -m redcrawl.cli crawl``) with real Scrapy
workers against the local shop site and a real Redis; the supervisor tests run small
Python programs as "workers" so they need no Scrapy and take a second.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from redcrawl.demo.run import SPIDER, demo_worker_settings
from redcrawl.demo.site import ShopSite, SiteConfig
from redcrawl.frontier import open_frontier
from redcrawl.settings import Settings

from .conftest import RedisServer

ROOT = Path(__file__).resolve().parent.parent


def processes_with(text: str) -> list[int]:
    """Pids of the live processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def kill_all(text: str) -> None:
    for pid in processes_with(text):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def cli_env(redis_url: str) -> dict[str, str]:
    """Our environment without REDCRAWL_*/Scrapy variables, this checkout on the path."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("REDCRAWL_", "SCRAPY_")) and k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(ROOT / "src"), REDCRAWL_REDIS_URL=redis_url, COLUMNS="120")
    return env


def crawl_cmd(site: ShopSite, crawl: str, items_db: Path, *extra: str,
              workers: int = 1) -> list[str]:
    cmd = [sys.executable, "-m", "redcrawl.cli", "crawl", str(SPIDER), "--workers",
           str(workers), "--crawl", crawl, "--arg", f"url={site.url}"]
    for item in demo_worker_settings(items_db):
        cmd += ["--set", item]
    return [*cmd, *extra]


@pytest.fixture
def shop_site(request: pytest.FixtureRequest) -> Iterator[ShopSite]:
    config: SiteConfig = getattr(request, "param", SiteConfig(products=300))
    with ShopSite(config) as site:
        yield site
        kill_all(site.url)  # whatever a failed test left running


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_crawl_at_debug_log_level_fetches_every_page(redis7: RedisServer, tmp_path: Path,
                                                     shop_site: ShopSite) -> None:
    """Scrapy's default LOG_LEVEL (DEBUG) writes a line per request and item: a worker
    whose output nobody reads blocks once the pipe is full (it stopped at 32 of 311
    pages). Every page is fetched, and the worker's log (with Scrapy's closing stats) is
    in the crawl's folder."""
    redis.Redis.from_url(redis7.url).flushall()
    items_db = tmp_path / "items.db"
    cmd = crawl_cmd(shop_site, "debug", items_db, "--set", "LOG_LEVEL=DEBUG")
    out = tmp_path / "out.txt"
    with out.open("wb") as sink:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(redis7.url), stdout=sink,
                                stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=150)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"redcrawl crawl hung at DEBUG: "
                                 f"{len(shop_site.hits())} pages fetched") from None
    text = out.read_text(errors="replace")
    assert code == 0, text[-3000:]
    expected = shop_site.canonical_pages()
    assert expected <= set(shop_site.hits()), len(expected - set(shop_site.hits()))
    log = tmp_path / ".redcrawl" / "logs" / "debug" / "w0.log"
    assert str(log.relative_to(tmp_path)) in text  # said where the logs are
    written = log.read_text(errors="replace")
    assert " DEBUG: Crawled (200)" in written and "Dumping Scrapy stats" in written
