"""Run Scrapy in a subprocess (Twisted's reactor can't restart in-process) against a
real Redis, and read back what it did (``rc_testkit.Report``'s JSON)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import redis

from redcrawl.codec import Envelope
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import FrontierCore, open_frontier
from redcrawl.settings import Settings
from redcrawl.workers import REDCRAWL_COMPONENTS, worker_command

HERE = Path(__file__).resolve().parent

FAST = {
    "LOG_LEVEL": "INFO",
    "TELNETCONSOLE_ENABLED": "False",
    "REDCRAWL_LEASE_TTL": "3",
    "REDCRAWL_RETRY_BACKOFF": "0.05",
    "REDCRAWL_IDLE_BEFORE_CLOSE": "0",
    "RETRY_TIMES": "1",
    "DOWNLOAD_TIMEOUT": "5",
}
"""Small, fast settings for every test crawl."""

REDCRAWL = dict(item.split("=", 1) for item in REDCRAWL_COMPONENTS)
"""The settings that put a spider on redcrawl (every command below has them)."""


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a worker: ours without REDCRAWL_* / Scrapy project variables
    (they would override the test's settings), the spiders' folder on PYTHONPATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("REDCRAWL_", "SCRAPY_")) and k != "PYTHONPATH"
    }
    # this checkout's redcrawl, whatever copy is installed
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent.parent / "src")])
    env.update(extra)
    return env


@dataclass
class Run:
    """One finished Scrapy process."""

    returncode: int
    stderr: str
    report: dict[str, Any]
    elapsed: float

    @property
    def stats(self) -> dict[str, Any]:
        return dict(self.report.get("stats", {}))

    @property
    def urls(self) -> list[str]:
        """URLs of the responses received, in order."""
        return [r[0] for r in self.report.get("responses", [])]

    def paths(self) -> Counter[str]:
        """Responses received per path (with query)."""
        out: Counter[str] = Counter()
        for url in self.urls:
            parts = urlsplit(url)
            out[parts.path + (f"?{parts.query}" if parts.query else "")] += 1
        return out

    def tail(self, n: int = 4000) -> str:
        return self.stderr[-n:]

    def ok(self) -> Run:
        assert self.returncode == 0, f"scrapy exited with {self.returncode}:\n{self.tail()}"
        assert self.report, f"no report written:\n{self.tail()}"
        assert self.report["reason"] == "finished", self.tail()
        return self


class Worker:
    """A Scrapy process started in the background; ``wait()`` gives its :class:`Run`.
    Its output goes to a log file next to ``out`` (a pipe nobody reads while it runs
    would block the worker once full)."""

    def __init__(self, cmd: list[str], out: Path, *, cwd: Path, env: dict[str, str]) -> None:
        self.out = out
        self.out.unlink(missing_ok=True)
        self.log = out.with_suffix(".log")
        self.started = time.monotonic()
        self.launched_at = time.time()  # wall clock, comparable with the report's times
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                cmd,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Kill the process if the test left before waiting for it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait(self, timeout: float = 60) -> Run:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"scrapy did not finish in {timeout} s:\n{self.output()[-4000:]}"
            ) from None
        report = json.loads(self.out.read_text()) if self.out.exists() else {}
        return Run(self.proc.returncode, self.output(), report, time.monotonic() - self.started)


def runspider_cmd(
    spider: str,
    *,
    redis_url: str,
    crawl: str,
    out: Path,
    settings: dict[str, Any] | None = None,
    args: dict[str, Any] | None = None,
) -> list[str]:
    merged = {
        **FAST,
        "REDCRAWL_REDIS_URL": redis_url,
        "REDCRAWL_CRAWL": crawl,
        "RC_TEST_OUT": str(out),
        **(settings or {}),
    }
    return worker_command(HERE / spider, settings=merged, spider_args=args or {})


def start_spider(
    spider: str,
    directory: Path,
    *,
    redis_url: str,
    crawl: str,
    tag: str = "run",
    settings: dict[str, Any] | None = None,
    args: dict[str, Any] | None = None,
) -> Worker:
    """Start ``scrapy runspider tests/scrapy_projects/<spider>`` on redcrawl's scheduler."""
    out = directory / f"{tag}.json"
    cmd = runspider_cmd(
        spider, redis_url=redis_url, crawl=crawl, out=out, settings=settings, args=args
    )
    return Worker(cmd, out, cwd=directory, env=clean_env())


def run_spider(spider: str, directory: Path, **kwargs: Any) -> Run:
    """Run a spider to its end (see :func:`start_spider`)."""
    return start_spider(spider, directory, **kwargs).wait()


def frontier(client: redis.Redis, crawl: str, **settings: Any) -> FrontierCore:
    """The crawl's frontier, for inspection from the test."""
    return open_frontier(client, Settings(**settings), crawl)


def crawl_keys(client: redis.Redis, crawl: str) -> list[bytes]:
    """Every Redis key of a crawl (default prefix)."""
    return sorted(cast("list[bytes]", client.keys(f"rc:{{{crawl}}}:*")))  # no decoding


def wait_for(predicate: Any, timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def finished_state(client: redis.Redis, crawl: str, *urls: str) -> None:
    """Give a crawl the state of a finished one: ``urls`` stored and done (as if a
    worker fetched them), nothing pending, no worker alive."""
    f = frontier(client, crawl)
    f.push([Envelope(url=u, fingerprint=fingerprint(u)) for u in urls])
    leases = f.lease("setup", len(urls))
    assert f.ack(leases) == len(urls)
    client.hdel(f.keys.workers, "setup")  # lease() registered it as a live worker
    c = f.counts()
    assert c.finished and c.done == len(urls) and not f.workers()
