"""A ``scrapy crawl`` worker whose settings change an existing crawl's layout (here
``REDCRAWL_POLITENESS=off`` on a crawl created with fleet-wide politeness) is refused
cleanly: one CRITICAL line that says what to do, exit code 1, no traceback, and the crawl
untouched (``redcrawl crawl`` refuses such settings itself before any worker starts:
tests/test_cli.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import open_frontier
from redcrawl.scrapy.scheduler import layout_hint
from redcrawl.settings import Settings
from redcrawl.workers import worker_command

from .conftest import RedisServer
from .sitekit import SiteSpec, serving

ROOT = Path(__file__).resolve().parent.parent
SITEKIT = Path(__file__).with_name("sitekit.py")


def test_a_worker_that_changes_the_layout_exits_with_one_critical_line(
    redis7: RedisServer, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    with serving([SiteSpec(pages=4, links=2)]) as kit:
        frontier = open_frontier(client, Settings(), "layout")
        assert frontier.politeness == "host"  # created with fleet-wide politeness
        root = kit.roots[0]
        assert frontier.push([Envelope(url=root, fingerprint=fingerprint(root))]).accepted == 1
        before = frontier.counts()
        log = tmp_path / "worker.log"
        cmd = worker_command(
            SITEKIT,
            settings=["TELNETCONSOLE_ENABLED=False", "LOG_LEVEL=INFO"],
            spider_args={"urls": root},
        )
        env = {
            **os.environ,
            "REDCRAWL_REDIS_URL": redis7.url,
            "REDCRAWL_CRAWL": "layout",
            "REDCRAWL_POLITENESS": "off",
            "PYTHONPATH": str(ROOT / "src"),
        }
        with log.open("wb") as out:
            proc = subprocess.run(
                cmd, env=env, stdout=subprocess.DEVNULL, stderr=out, cwd=tmp_path, timeout=120
            )
        text = log.read_text()
        assert proc.returncode != 0, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        critical = [line for line in text.splitlines() if "] CRITICAL:" in line]
        assert len(critical) == 1, text[-3000:]
        assert "REDCRAWL_POLITENESS" in critical[0]
        assert "purge" in critical[0]
        assert kit.fetches(kit.hosts[0]) == []  # nothing fetched
        after = frontier.counts()
        assert after == before
        assert after.conserved and after.ready == 1
    client.close()


def test_the_hint_names_the_politeness_setting_that_differs() -> None:
    created = 'the crawl was created with backend/ordering, tier bounds and dedupe "{}" and '
    msg = (created + 'this worker uses "{}"; give every worker ...').format
    off = Settings(politeness=False)
    assert "REDCRAWL_POLITENESS off" in layout_hint(msg("fifo/host 1,0 x", "fifo 1,0 x"), off)
    key = layout_hint(msg("fifo/host 1,0 x", "fifo/domain 1,0 x"), Settings())
    assert "REDCRAWL_POLITENESS_KEY" in key and "by host" in key
    assert layout_hint(msg("lifo/host 1,0 x", "fifo/host 1,0 x"), Settings()) == ""
    assert layout_hint("something else", off) == ""
    assert layout_hint(msg("streams/2 1,0 x", "streams/4 1,0 x"), off) == ""
    assert layout_hint(msg("streams/2 1,0 x", "fifo/host 1,0 x"), Settings()) == ""


def _worker_log(tmp_path: Path, root: str, env_extra: dict[str, str]) -> tuple[int, str]:
    log = tmp_path / "worker.log"
    cmd = worker_command(
        SITEKIT,
        settings=["TELNETCONSOLE_ENABLED=False", "LOG_LEVEL=INFO"],
        spider_args={"urls": root},
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **env_extra}
    with log.open("wb") as out:
        proc = subprocess.run(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=out, cwd=tmp_path, timeout=120
        )
    return proc.returncode, log.read_text()


@pytest.mark.parametrize(
    ("env_extra", "named"),
    [
        ({"REDCRAWL_PARTITIONS": "0"}, "REDCRAWL_PARTITIONS"),  # refused in from_crawler
        ({"REDCRAWL_BACKOFF_CAP": "nan"}, "REDCRAWL_BACKOFF_CAP"),
        ({"REDCRAWL_REDIS_URL": "redis+clustr://127.0.0.1:1"}, "REDCRAWL_REDIS_URL"),  # at open
        ({"REDCRAWL_REDIS_URL": "redis://127.0.0.1:1"}, "cannot reach Redis"),
    ],
)
def test_a_wrong_setting_or_an_absent_redis_is_one_critical_line(
    redis7: RedisServer, tmp_path: Path, env_extra: dict[str, str], named: str
) -> None:
    """A user's wrong setting (or a Redis that is not there) must read as one CRITICAL line
    naming it, not as tracebacks of Scrapy's engine ("Engine slot not assigned")."""
    with serving([SiteSpec(pages=2, links=1)]) as kit:
        env = {"REDCRAWL_REDIS_URL": redis7.url, "REDCRAWL_CRAWL": "wrong", **env_extra}
        code, text = _worker_log(tmp_path, kit.roots[0], env)
        assert code != 0, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        critical = [line for line in text.splitlines() if "] CRITICAL:" in line]
        assert len(critical) == 1, text[-3000:]
        assert named in critical[0]
        assert kit.fetches(kit.hosts[0]) == []


def test_a_worker_with_another_partition_count_is_refused_naming_the_crawl(
    redis7: RedisServer, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    with serving([SiteSpec(pages=2, links=1)]) as kit:
        root = kit.roots[0]
        frontier = open_frontier(client, Settings(partitions=4), "parts")
        assert frontier.push([Envelope(url=root, fingerprint=fingerprint(root))]).accepted == 1
        env = {"REDCRAWL_REDIS_URL": redis7.url, "REDCRAWL_CRAWL": "parts"}
        code, text = _worker_log(tmp_path, root, env)
        assert code != 0, text[-3000:]
        critical = [line for line in text.splitlines() if "] CRITICAL:" in line]
        assert len(critical) == 1, text[-3000:]
        said = critical[0].split("redcrawl: ", 1)[1]
        assert said.startswith("crawl 'parts' was created"), said  # not "crawl '?'"
        assert "REDCRAWL_PARTITIONS" in said
        assert kit.fetches(kit.hosts[0]) == []
    client.close()
