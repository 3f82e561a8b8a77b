"""What ``redcrawl crawl`` tells a user in the terminal (found by trying redcrawl as a
stranger): the workers' own logs go to files, so what only they say is not seen."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from redcrawl.frontier import open_frontier
from redcrawl.settings import Settings

from .conftest import RedisServer
from .sitekit import SITEKIT_FILE, SiteSpec, serving
from .test_politeness_fleet import fresh_frontier
from .test_workers import cli_env


def run_crawl(redis_url: str, crawl: str, cwd: Path, roots: list[str], *sets: str) -> str:
    args = [a for s in sets for a in ("--set", s)]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "redcrawl.cli",
            "crawl",
            str(SITEKIT_FILE),
            "--workers",
            "2",
            "--crawl",
            crawl,
            "--no-progress",
            "--set",
            "TELNETCONSOLE_ENABLED=False",
            "--set",
            "REDCRAWL_IDLE_BEFORE_CLOSE=0.5",
            *args,
            "--arg",
            "urls=" + ",".join(roots),
        ],
        cwd=cwd,
        env=cli_env(redis_url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return " ".join(proc.stderr.split())  # rich wraps long lines


@pytest.mark.slow
def test_crawl_says_in_the_terminal_that_per_site_limits_hold_for_all_its_workers(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """A migrated scrapy-redis project with ``CONCURRENT_REQUESTS_PER_DOMAIN = 4`` and
    ``DOWNLOAD_DELAY = 0.25`` run by ``redcrawl crawl -w 2``: the terminal says, before the
    crawl starts, that a site gets at most 4 requests at once and one every 0.25 s from
    the 2 workers together (scrapy-redis: from each), and how to get the old meaning.
    Seen before: nothing in the terminal; one INFO line without the numbers in each
    worker's log file."""
    fresh_frontier(redis7, "trials-say", "lists")
    with serving([SiteSpec(pages=2)]) as kit:
        out = run_crawl(
            redis7.url,
            "trials-say",
            tmp_path,
            kit.roots,
            "CONCURRENT_REQUESTS_PER_DOMAIN=4",
            "DOWNLOAD_DELAY=0.25",
        )
    assert "at most 4 requests at once" in out, out
    assert "0.25 s" in out and "2 workers together" in out, out
    assert "REDCRAWL_POLITENESS=off" in out, out


@pytest.mark.slow
def test_crawl_says_when_each_worker_limits_itself(redis7: RedisServer, tmp_path: Path) -> None:
    fresh_frontier(redis7, "trials-say-off", "lists")
    with serving([SiteSpec(pages=2)]) as kit:
        out = run_crawl(
            redis7.url, "trials-say-off", tmp_path, kit.roots, "REDCRAWL_POLITENESS=off"
        )
    assert "each worker" in out and "REDCRAWL_POLITENESS=off" in out, out


@pytest.mark.slow
def test_crawl_warns_when_it_changes_the_limits_of_running_workers(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """Workers of the crawl run with 2 at once and 0.5 s (another ``redcrawl crawl`` or a
    ``scrapy crawl`` elsewhere); a new command with other settings joins: the last worker
    to start sets the crawl's limits for every worker, so the terminal says so. Seen
    before: a warning in the new workers' log files only."""
    crawl = "trials-say-change"
    frontier = fresh_frontier(redis7, crawl, "lists")
    running = open_frontier(
        frontier.client,
        Settings(politeness_concurrency=2, politeness_delay=0.5, politeness_randomize=False),
        crawl,
    )
    running.store_politeness(worker=True)
    running.renew("elsewhere:w0", ttl=120)  # a live worker of the crawl
    with serving([SiteSpec(pages=2)]) as kit:
        out = run_crawl(
            redis7.url,
            crawl,
            tmp_path,
            kit.roots,
            "CONCURRENT_REQUESTS_PER_DOMAIN=8",
            "DOWNLOAD_DELAY=0",
        )
    assert "warning: workers of crawl trials-say-change are running with concurrency 2" in out
    assert "to concurrency 8, delay 0 s" in out, out


@pytest.mark.slow
def test_crawl_says_when_the_crawl_is_already_finished(redis7: RedisServer, tmp_path: Path) -> None:
    """The same command run again after the crawl finished: nothing is fetched (state is
    kept), and the terminal says why and how to start over. Seen before: a table and
    exit 0 after a second, the reason only in the workers' log files."""
    crawl = "trials-again"
    fresh_frontier(redis7, crawl, "lists")
    with serving([SiteSpec(pages=2)]) as kit:
        first = run_crawl(redis7.url, crawl, tmp_path, kit.roots)
        again = run_crawl(redis7.url, crawl, tmp_path, kit.roots)
        assert kit.fetched(kit.hosts[0])["/"] == 1
    assert "already finished" not in first and "is finished" not in first, first
    assert f"crawl {crawl} is finished (3 done)" in again, again
    assert f"redcrawl purge --crawl {crawl}" in again, again


SPIDER_WITH_OWN_SETTINGS = """
import scrapy


class OwnSettingsSpider(scrapy.Spider):
    name = "own_settings"
    custom_settings = {
        "CONCURRENT_REQUESTS_PER_DOMAIN": 3,
        "DOWNLOAD_DELAY": 0.1,
        "REDCRAWL_ORDERING": "lifo",
    }

    def __init__(self, urls="", **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [u for u in urls.split(",") if u]

    def parse(self, response):
        yield from response.follow_all(css="a", callback=self.parse)
"""


@pytest.mark.slow
def test_crawl_reads_the_spiders_own_settings(redis7: RedisServer, tmp_path: Path) -> None:
    """A spider's ``custom_settings`` beat the project's, as in ``scrapy crawl``: the
    limits line shows the spider's, and a crawl created with the spider's ordering (lifo)
    is not refused as "created with other settings". Seen before: the project's (Scrapy's
    default 8 at once, no delay), and exit 2 for the layout."""
    crawl = "trials-own"
    frontier = fresh_frontier(redis7, crawl, "lists")
    created = open_frontier(frontier.client, Settings(ordering="lifo"), crawl)
    created.maintain()  # the crawl exists, created lifo
    spider = tmp_path / "own_spider.py"
    spider.write_text(SPIDER_WITH_OWN_SETTINGS)
    with serving([SiteSpec(pages=2)]) as kit:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "redcrawl.cli",
                "crawl",
                str(spider),
                "--crawl",
                crawl,
                "--no-progress",
                "--arg",
                "urls=" + ",".join(kit.roots),
            ],
            cwd=tmp_path,
            env=cli_env(redis7.url),
            capture_output=True,
            text=True,
            timeout=120,
        )
    out = " ".join(proc.stderr.split())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "at most 3 requests at once" in out and "one every 0.1 s" in out, out


@pytest.mark.slow
def test_crawl_says_when_the_crawl_is_paused(redis7: RedisServer, tmp_path: Path) -> None:
    """``redcrawl crawl`` of a paused crawl: its workers lease nothing and the command
    waits for a resume; the terminal says so at start. Seen before: a progress line at
    0/s and nothing else, a crawl that looked hung."""
    crawl = "trials-paused"
    frontier = fresh_frontier(redis7, crawl, "lists")
    frontier.pause()
    with serving([SiteSpec(pages=2)]) as kit:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "redcrawl.cli",
                "crawl",
                str(SITEKIT_FILE),
                "--crawl",
                crawl,
                "--no-progress",
                "--arg",
                "urls=" + ",".join(kit.roots),
            ],
            cwd=tmp_path,
            env=cli_env(redis7.url),
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert proc.stderr is not None
            seen = ""
            deadline = time.monotonic() + 60
            while "is paused" not in seen and time.monotonic() < deadline:
                line = proc.stderr.readline()
                if not line:
                    break
                seen += line
            assert f"crawl {crawl} is paused" in seen, seen
            assert f"redcrawl resume --crawl {crawl}" in " ".join(seen.split()), seen
        finally:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
    assert proc.returncode == 130
