"""Two ``redcrawl crawl`` commands (two worker groups) on one machine and one crawl, as a
user adding workers to a running crawl does. Found by trying redcrawl as a stranger.

Real commands (``python -m redcrawl.cli crawl``), real Scrapy workers, a real Redis,
loopback sites that count every fetch (tests/sitekit.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from redcrawl.frontier import FrontierCore

from .conftest import RedisServer
from .sitekit import SITEKIT_FILE, MultiSite, SiteSpec, format_summary, serving
from .test_politeness_fleet import fresh_frontier
from .test_workers import cli_env

CONCURRENCY = 2


def group_cmd(kit: MultiSite, crawl: str, logs: Path | None, *extra: str) -> list[str]:
    """One ``redcrawl crawl`` of the kit's sites with one worker and no restarts."""
    return [
        sys.executable,
        "-m",
        "redcrawl.cli",
        "crawl",
        str(SITEKIT_FILE),
        "--workers",
        "1",
        "--crawl",
        crawl,
        "--max-restarts",
        "0",
        "--no-progress",
        *(["--logs", str(logs)] if logs is not None else []),
        "--set",
        f"CONCURRENT_REQUESTS_PER_DOMAIN={CONCURRENCY}",
        "--set",
        "DOWNLOAD_DELAY=0",
        "--set",
        "RETRY_ENABLED=False",
        "--set",
        "TELNETCONSOLE_ENABLED=False",
        "--set",
        "LOG_LEVEL=INFO",
        "--set",
        "REDCRAWL_IDLE_BEFORE_CLOSE=0.5",
        "--arg",
        "urls=" + ",".join(kit.roots),
        *extra,
    ]


@contextlib.contextmanager
def group(
    cmd: list[str], redis_url: str, cwd: Path, out: Path
) -> Iterator[subprocess.Popen[bytes]]:
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=cli_env(redis_url), stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def worker_of(supervisor: int) -> int:
    """The pid of the one worker process of the ``redcrawl crawl`` ``supervisor``."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise AssertionError(f"redcrawl crawl {supervisor} started no worker")


def workers_named(frontier: FrontierCore, index: str) -> list[str]:
    return [w for w in frontier.workers() if f":{index}:" in w]


def wait_for(what: str, check: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not callable(check) or not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_crashed_worker_of_one_group_leaves_the_other_groups_leases_alone(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """Group A's w0 crawls slow sites and holds every slot of them; group B's w0 joins
    and is SIGKILLed. B's supervisor gives back what *its* w0 held, never what A's w0
    holds: A's pages are fetched once each and no site sees more than its limit at once.

    Seen before the fix: both groups named their workers ``<host>:<crawl>:w0``, and B's
    supervisor released every worker of that name, A's live w0 included: A's requests went
    back to the queue while A was fetching them, were fetched a second time, and their
    sites' slots were freed under A's feet (3 in progress against a limit of 2)."""
    crawl = "trials-groups"
    frontier = fresh_frontier(redis7, crawl, "lists")
    sites = [SiteSpec(pages=10, links=3, delay=1.0) for _ in range(2)]
    with serving(sites) as kit:
        a_cmd = group_cmd(kit, crawl, tmp_path / "logs-a")
        b_cmd = group_cmd(kit, crawl, tmp_path / "logs-b")
        with group(a_cmd, redis7.url, tmp_path, tmp_path / "a.out") as a:
            wait_for("group A's worker to hold leases", lambda: len(frontier.inflight(100)) >= 2)
            a_names = set(frontier.workers())
            with group(b_cmd, redis7.url, tmp_path, tmp_path / "b.out") as b:
                b_worker = worker_of(b.pid)
                wait_for("group B's worker", lambda: len(workers_named(frontier, "w0")) == 2)
                os.kill(b_worker, signal.SIGSTOP)
                time.sleep(0.05)
                held_by_b = {
                    (u.hostname, u.path)
                    for x in frontier.inflight(100)
                    if x.worker not in a_names and (u := urlsplit(x.url))
                }
                killed_at = time.monotonic()
                os.killpg(b_worker, signal.SIGKILL)
                assert b.wait(60) == 1, (tmp_path / "b.out").read_text()
            assert a.wait(120) == 0, (tmp_path / "a.out").read_text()
        table = format_summary(kit.summary())
        twice = {
            f"{h}{p}": n
            for h in kit.hosts
            for p, n in kit.fetched(h).items()
            if n > 1 and (h, p) not in held_by_b
        }
        assert not twice, f"fetched more than once (B's w0 held {held_by_b}): {twice}\n{table}"
        over = {
            h: n
            for h in kit.hosts
            if (n := most_at_once(kit, h, held_by_b, killed_at)) > CONCURRENCY
        }
        assert not over, f"more than {CONCURRENCY} in progress at {over}\n{table}"
        c = frontier.counts()
        assert c.finished and c.conserved and c.dead == 0, c


def most_at_once(kit: MultiSite, host: str, killed: set[tuple[str | None, str]], at: float) -> int:
    """The most fetches in progress at once at ``host``, where a fetch of the killed
    worker's (``killed``: its (host, path) in flight when it was SIGKILLed ``at``) ends at
    the kill: the site goes on "serving" a dead connection until its reply fails (seen in
    CI: a 1 s page's BrokenPipe after the kill, while the slot the dead worker held had
    rightly gone back to the fleet), which no client is waiting for."""
    with kit.recorder.lock:
        fetches = list(kit.recorder.log.get(host, []))
    edges = []
    for f in fetches:
        end = f.end if f.end is not None else float("inf")
        if (host, f.path) in killed and f.start <= at:
            end = min(end, at)
        edges += [(f.start, 1), (end, -1)]
    most = now = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):
        now += step
        most = max(most, now)
    return most


def printed_log_dir(out: Path) -> Path:
    """The folder a ``redcrawl crawl`` printed its workers' logs in (its last line saying
    so, relative to its folder)."""
    lines = [ln for ln in out.read_text().splitlines() if ln.startswith("worker logs: ")]
    assert lines, out.read_text()
    return Path(lines[-1].removeprefix("worker logs: ").rstrip("/"))


@pytest.mark.slow
def test_a_second_crawl_command_keeps_the_first_ones_worker_logs(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """Two ``redcrawl crawl`` commands of one crawl in one folder, default log folder:
    each worker's log holds that worker's whole output. Seen before the fix: the second
    command made ``.redcrawl/logs/<crawl>/w0.log`` anew while the first command's w0 was
    writing it, so the first one's start (its settings, the politeness line) was gone."""
    crawl = "trials-logs"
    frontier = fresh_frontier(redis7, crawl, "lists")
    sites = [SiteSpec(pages=8, links=3, delay=0.5) for _ in range(2)]
    with serving(sites) as kit:
        cmd = group_cmd(kit, crawl, None)
        with group(cmd, redis7.url, tmp_path, tmp_path / "a.out") as a:
            wait_for("group A's worker", lambda: len(frontier.workers()) == 1)
            with group(cmd, redis7.url, tmp_path, tmp_path / "b.out") as b:
                assert b.wait(120) == 0, (tmp_path / "b.out").read_text()
            assert a.wait(120) == 0, (tmp_path / "a.out").read_text()
    dirs = [tmp_path / printed_log_dir(tmp_path / f"{g}.out") for g in "ab"]
    assert dirs[0] != dirs[1], dirs
    for d in dirs:
        log = (d / "w0.log").read_bytes()
        assert b"\0" not in log, f"{d}/w0.log written over by another command"
        assert log.count(b"(start)") == 1, log[:2000]
        assert b"redcrawl: worker " in log and b"Spider closed (finished)" in log, log[-2000:]
