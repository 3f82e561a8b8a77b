"""An outside tester's findings on ``redcrawl crawl``'s supervisor: a worker that fails
the same way every time is not restarted, and why it failed reaches the terminal; a
worker stopped by a signal of its own is said, not silently dropped from the fleet.

Real ``redcrawl crawl`` runs with real Scrapy workers on the local shop site and a real
Redis; the supervisor tests run small Python programs that write what a Scrapy worker
writes to its log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from redcrawl.demo.site import ShopSite, SiteConfig
from redcrawl.failure_file import FAILURE_FILE_ENV
from redcrawl.frontier import open_frontier
from redcrawl.settings import Settings
from redcrawl.workers import NOT_TRANSIENT, Fleet, WorkerEvent, read_run

from .conftest import RedisServer
from .test_workers import (
    SLOW_SHOP,
    cli_env,
    crawl_cmd,
    kill_all,
    processes_with,
    python,
    wait_until,
)

CRITICAL = (
    "2026-12-02 06:18:27 [redcrawl.scrapy.scheduler] CRITICAL: redcrawl: cannot store "
    "<GET http://x/p1>: callback '_parse_detail' is private; closing the spider (reason "
    "{reason!r}, exit code 1)"
)


def worker_writing(reason: str, *, rc: int = 1) -> list[str]:
    """A "worker" that logs a redcrawl failure, then a long stats dump, and exits rc;
    as a real one, it writes the reason to its failure file
    (:func:`redcrawl.failure_file.write_failure`)."""
    stats = "".join(f"print(\" 'stat/{i}': {i},\")\n" for i in range(40))
    return python(
        f"import os\nopen(os.environ[{FAILURE_FILE_ENV!r}], 'w').write({reason!r})\n"
        f"print({CRITICAL.format(reason=reason)!r})\n"
        "print('2026-12-02 06:18:27 [scrapy.core.engine] ERROR: redcrawl: the store failed')\n"
        "print('2026-12-02 06:18:27 [scrapy.core.engine] ERROR: Spider error processing "
        "<GET http://redcrawl.example/>')\n"
        f"{stats}print(\" 'redcrawl/failure': {reason!r},\")\n"
        f"print('2026-12-02 06:18:27 [scrapy.core.engine] INFO: Spider closed ({reason})')\n"
        f"raise SystemExit({rc})\n"
    )


@pytest.mark.parametrize("reason", sorted(NOT_TRANSIENT))
def test_a_deterministic_failure_is_not_restarted(tmp_path: Path, reason: str) -> None:
    events: list[WorkerEvent] = []
    result = Fleet(
        worker_writing(reason), workers=1, log_dir=tmp_path, backoff=0.01, on_event=events.append
    ).run()
    assert result.restarts == 0 and result.returncodes == [1] and result.code == 1
    assert [e.kind for e in events] == ["failed"]
    assert f"redcrawl failure {reason!r}, not restarted" in events[0].message
    assert "no worker is left" in events[0].message
    assert events[0].failure == reason
    lines = events[0].problems.splitlines()
    assert len(lines) == 2 and "CRITICAL: redcrawl: cannot store" in lines[0], lines
    assert "ERROR: redcrawl: the store failed" in lines[1]  # not the spider's own errors


def test_a_transient_failure_is_restarted_and_says_why(tmp_path: Path) -> None:
    events: list[WorkerEvent] = []
    result = Fleet(
        worker_writing("redis_unavailable"),
        workers=1,
        log_dir=tmp_path,
        max_restarts=2,
        backoff=0.01,
        on_event=events.append,
    ).run()
    assert result.restarts == 2
    assert [e.kind for e in events] == ["restarting", "restarting", "failed"]
    for event in events:  # each run's own lines, not the earlier runs' again
        assert event.problems.count("CRITICAL") == 1 and event.failure == "redis_unavailable"


def test_a_failure_only_logged_is_restarted(tmp_path: Path) -> None:
    """The reason comes from the failure file, not from the log's text: a worker that
    logs a CRITICAL line with a deterministic reason but wrote no file (a spider printing
    such a line) is restarted as any crash."""
    events: list[WorkerEvent] = []
    logged = python(f"print({CRITICAL.format(reason='config_error')!r})\nraise SystemExit(1)\n")
    result = Fleet(
        logged, workers=1, log_dir=tmp_path, max_restarts=1, backoff=0.01, on_event=events.append
    ).run()
    assert result.restarts == 1 and [e.kind for e in events] == ["restarting", "failed"]
    assert events[0].failure is None


def test_read_run_reads_only_the_last_run(tmp_path: Path) -> None:
    log = tmp_path / "w0.log"
    log.write_text(CRITICAL.format(reason="config_error") + "\n--- redcrawl: worker w0\n")
    start = log.stat().st_size
    with log.open("a") as f:
        f.write("x" * 400_000 + "\n" + CRITICAL.format(reason="redis_error") + "\n")
    run = read_run(log, start)
    assert len(run.problems) == 1 and "'redis_error'" in run.problems[0]
    assert "'config_error'" in read_run(log).problems[0]


def test_a_worker_stopped_by_its_own_signal_is_reported(tmp_path: Path) -> None:
    events: list[WorkerEvent] = []
    stopped = python(
        "import time\n"
        "print('2026-12-02 [scrapy.crawler] INFO: Received SIGTERM, shutting down gracefully.')\n"
        "print('2026-12-02 [scrapy.core.engine] INFO: Spider closed (shutdown)')\n"
    )
    Fleet(stopped, workers=1, log_dir=tmp_path, on_event=events.append).run()
    assert [e.kind for e in events] == ["exited"]
    assert events[0].message == (
        "worker w0 was stopped by SIGTERM before the crawl finished, finish reason "
        "'shutdown'; it is not restarted, no worker is left"
    )


def test_a_worker_that_finished_is_not_reported(tmp_path: Path) -> None:
    events: list[WorkerEvent] = []
    done = python("print('2026-12-02 [scrapy.core.engine] INFO: Spider closed (finished)')")
    Fleet(done, workers=2, log_dir=tmp_path, on_event=events.append).run()
    assert events == []


# --- real crawls -------------------------------------------------------------------------


@pytest.fixture
def shop_site(request: pytest.FixtureRequest) -> Iterator[ShopSite]:
    config: SiteConfig = getattr(request, "param", SiteConfig(products=300))
    with ShopSite(config) as site:
        yield site
        kill_all(site.url)  # whatever a failed test left running


PRIVATE = """
import scrapy


class Private(scrapy.Spider):
    name = "private"

    def __init__(self, url="", **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [url]

    def parse(self, response):
        for href in response.css("a::attr(href)").getall()[:3]:
            yield response.follow(href, callback=self._detail)

    def _detail(self, response):
        yield {"url": response.url}
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_crawl_shows_why_a_worker_failed_and_does_not_restart_it(
    redis7: RedisServer, tmp_path: Path, shop_site: ShopSite
) -> None:
    """The tester's `_private` callback: the worker closes with `unstorable_request`; the
    command says so with the worker's CRITICAL line, restarts nothing, exits 1."""
    redis.Redis.from_url(redis7.url).flushall()
    spider = tmp_path / "private.py"
    spider.write_text(PRIVATE)
    cmd = [
        sys.executable,
        "-m",
        "redcrawl.cli",
        "crawl",
        str(spider),
        "-w",
        "1",
        "--crawl",
        "private",
        "--arg",
        f"url={shop_site.url}",
        "--no-progress",
    ]
    env = {**cli_env(redis7.url), "COLUMNS": "400"}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=100)
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 1, out[-3000:]
    assert "restarting" not in out, out[-3000:]
    assert "redcrawl failure 'unstorable_request', not restarted" in out, out[-3000:]
    assert "CRITICAL: redcrawl: cannot store" in out and "_detail" in out, out[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("shop_site", [SLOW_SHOP], indirect=True)
def test_a_worker_sigtermed_from_outside_is_said(
    redis7: RedisServer, tmp_path: Path, shop_site: ShopSite
) -> None:
    """One worker of two gets SIGTERM (not the command): it exits 0 ("shutdown"), the
    terminal says it stopped before the crawl finished; the other finishes the crawl."""
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    frontier = open_frontier(client, Settings(), "term")
    cmd = crawl_cmd(
        shop_site, "term", tmp_path / "items.db", "--set", "CONCURRENT_REQUESTS=4",
        "--no-progress", workers=2,
    )  # fmt: skip
    out = tmp_path / "out.txt"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, env=cli_env(redis7.url), stdout=sink, stderr=subprocess.STDOUT
        )
        wait_until(lambda: frontier.counts().done >= 100, proc, out)
        victims = processes_with("-m scrapy ", shop_site.url)
        assert len(victims) == 2
        os.kill(victims[0], signal.SIGTERM)
        code = proc.wait(timeout=200)
    text = out.read_text(errors="replace")
    assert code == 0, text[-3000:]
    # (the demo's workers log at WARNING: Scrapy's "Received SIGTERM" is not in their logs)
    said = "worker w0 exited with status 0 before the crawl finished; it is not restarted"
    assert said in text and "the other one goes on" in text, text[-3000:]
    assert frontier.counts().finished


def test_a_scrapy_usage_error_is_not_restarted(tmp_path: Path) -> None:
    """``scrapy`` exits 2 on a usage error (e.g. "No spider found in file"): the same
    command fails the same way again."""
    events: list[WorkerEvent] = []
    usage = python(
        "print('__main__.py: error: No spider found in file: spider.py')\nraise SystemExit(2)"
    )
    result = Fleet(usage, workers=1, log_dir=tmp_path, backoff=0.01, on_event=events.append).run()
    assert result.restarts == 0 and result.returncodes == [2] and result.code == 1
    assert [e.kind for e in events] == ["failed"]
    assert "status 2 (Scrapy's usage error), not restarted" in events[0].message
    assert "No spider found" in events[0].log_tail
