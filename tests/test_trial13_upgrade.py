"""Trial 13: an operator's rolling upgrade. A crawl runs on an older redcrawl; its workers
are replaced one at a time by the current one (README.md, docs/scrapy.md: `scrapy crawl`
on many machines with the same REDCRAWL_REDIS_URL), with real workers (`scrapy runspider
tests/sitekit.py`) on loopback sites and a real redis-server.

Found: a worker older than its crawl (the layout has a mark of a newer redcrawl) was told
"created with other settings than this worker's" / "than these" (`redcrawl crawl`, exit
2) before "the same settings, by a newer redcrawl ...; upgrade this worker". (The trial's
other finding, a crawl of a 14-minute window of development on 2026-12-02 refused by
today's workers, concerns no released version: left alone.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from redcrawl.redis_server import RedisServer

from .sitekit import MultiSite, SiteSpec, serving

ROOT = Path(__file__).resolve().parent.parent
SITEKIT = Path(__file__).with_name("sitekit.py")


@pytest.fixture
def r7(redis7: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    yield client
    client.close()


def _env(src: Path, url: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(src), "REDCRAWL_REDIS_URL": url}


def _worker(url: str, kit: MultiSite, crawl: str) -> list[str]:
    """`scrapy runspider tests/sitekit.py` on redcrawl's scheduler (docs/scrapy.md), with
    fleet-wide politeness (the default): 2 at once per site, one every 0.05 s."""
    sets = [
        "SCHEDULER=redcrawl.scrapy.Scheduler",
        "DUPEFILTER_CLASS=redcrawl.scrapy.DupeFilter",
        f"REDCRAWL_REDIS_URL={url}",
        f"REDCRAWL_CRAWL={crawl}",
        "CONCURRENT_REQUESTS_PER_DOMAIN=2",
        "DOWNLOAD_DELAY=0.05",
        "RANDOMIZE_DOWNLOAD_DELAY=False",
        "ROBOTSTXT_OBEY=False",
        "RETRY_ENABLED=False",
        "TELNETCONSOLE_ENABLED=False",
    ]
    cmd = [sys.executable, "-m", "scrapy", "runspider", str(SITEKIT)]
    cmd += ["-a", "urls=" + ",".join(kit.roots)]
    for s in sets:
        cmd += ["-s", s]
    return cmd


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 45) -> str:
    out = subprocess.run(
        cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    return f"exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"


def test_a_worker_older_than_the_crawl_is_told_to_upgrade_not_that_its_settings_differ(
    redis7: RedisServer, r7: redis.Redis, tmp_path: Path
) -> None:
    """Seen (the rolling upgrade, from the other side: a worker not yet upgraded meets a
    crawl whose layout carries a record-format mark of a newer redcrawl): the script says
    "the same settings, by a newer redcrawl (the mark ... is unknown here); upgrade this
    worker", but the worker's CRITICAL line begins "crawl 'x' was created with other
    settings than this worker's. In full: ..." and `redcrawl crawl` says "error: crawl x
    was created with other settings than these: ..." with exit 2 (docs/cli.md: bad usage or
    configuration, "purge it or use a new --crawl"): an operator reads a settings problem
    in the first words, and the two halves of one line contradict each other.

    The newer crawl is made as a newer redcrawl would store it: this redcrawl's layout of
    the same settings with one more mark (" +newmark") before its own marks."""
    crawl = "t13newer"
    with serving([SiteSpec(pages=2, links=1)]) as kit:
        env = _env(ROOT / "src", redis7.url)
        seeded = _run(
            [sys.executable, "-m", "redcrawl", "seed", "--crawl", crawl, *kit.roots], env, tmp_path
        )
        assert seeded.startswith("exit 0"), seeded
        control = f"rc:{{{crawl}}}:control"
        layout: Any = r7.hget(control, "layout")
        settings_part, marks = layout.split(b" +", 1)
        newer = settings_part + b" +newmark +" + marks
        r7.hset(control, mapping={"layout": newer, "layout.copy": newer})
        worker = _run(_worker(redis7.url, kit, crawl), env, tmp_path)
        cmd = [sys.executable, "-m", "redcrawl", "crawl", str(SITEKIT), "-w", "1"]
        cmd += ["--crawl", crawl, "--no-progress", "--arg", "urls=" + ",".join(kit.roots)]
        cli = _run(cmd, env, tmp_path)
    critical = [line for line in worker.splitlines() if "CRITICAL" in line]
    assert critical and "upgrade this worker" in critical[0], worker
    assert "other settings" not in critical[0], critical[0]
    error = [line for line in cli.splitlines() if line.startswith("error:")]
    assert error and "upgrade this worker" in error[0], cli
    assert "other settings" not in error[0], error[0]
