"""A RedisSpider (the class a migrating scrapy-redis project switches to) with a wrong
setting, a start key name that can't be used, or no Redis must be refused like a plain
spider (tests/test_layout_refusal.py): one CRITICAL line that says what to do, exit code 1,
no traceback. The spider is built before the scheduler opens, so its errors used to
surface as asyncio's "Task exception was never retrieved" with Scrapy's traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import RedisServer

ROOT = Path(__file__).resolve().parent.parent

SPIDER = """
from redcrawl.scrapy import RedisSpider


class Refused(RedisSpider):
    name = "refused"
    redis_key = {key!r}

    def parse(self, response):
        yield {{"url": response.url}}
"""


def _run(tmp_path: Path, key: str, settings: dict[str, str]) -> tuple[int, str]:
    spider = tmp_path / "refused_spider.py"
    spider.write_text(SPIDER.format(key=key))
    cmd = [sys.executable, "-m", "scrapy", "runspider", str(spider)]
    for name, value in {"TELNETCONSOLE_ENABLED": "False", **settings}.items():
        cmd += ["-s", f"{name}={value}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(cmd, env=env, capture_output=True, cwd=tmp_path, timeout=120)
    return proc.returncode, proc.stderr.decode(errors="replace")


def _refused(tmp_path: Path, key: str, settings: dict[str, str], named: str, reason: str) -> None:
    """The crawl exits 1 with one CRITICAL line naming ``named``, no traceback, and the
    spider closed with ``reason`` (not 'finished')."""
    code, text = _run(tmp_path, key, {"LOG_LEVEL": "INFO", **settings})
    assert code == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert "never retrieved" not in text, text[-3000:]
    critical = [line for line in text.splitlines() if "] CRITICAL:" in line]
    assert len(critical) == 1, text[-3000:]
    assert named in critical[0], critical[0]
    assert ".; closing" not in critical[0], critical[0]  # (a message's own full stop kept)
    assert f"'finish_reason': '{reason}'" in text, text[-3000:]


SCHEDULER = {"SCHEDULER": "redcrawl.scrapy.Scheduler"}


@pytest.mark.parametrize(
    ("key", "settings", "named"),
    [
        ("%(name)s:start_urls", {**SCHEDULER, "REDCRAWL_PARTITIONS": "0"}, "REDCRAWL_PARTITIONS"),
        ("start}urls", SCHEDULER, "REDIS_START_URLS_KEY"),
        (
            "%(name)s:start_urls",
            {**SCHEDULER, "REDIS_URL": "redis://127.0.0.1:1"},
            "cannot reach Redis",
        ),
        (
            "%(name)s:start_urls",
            {**SCHEDULER, "REDIS_START_URLS_AS_SET": "True", "REDIS_START_URLS_AS_ZSET": "True"},
            "REDIS_START_URLS_AS_ZSET",
        ),
        # the spider on Scrapy's own scheduler refuses by itself
        ("start}urls", {}, "REDIS_START_URLS_KEY"),
        ("%(name)s:start_urls", {"REDIS_URL": "redis://127.0.0.1:1"}, "cannot reach Redis"),
    ],
)
def test_a_redis_spider_that_cannot_start_is_one_critical_line(
    redis7: RedisServer, tmp_path: Path, key: str, settings: dict[str, str], named: str
) -> None:
    reason = "redis_unavailable" if named == "cannot reach Redis" else "config_error"
    _refused(tmp_path, key, {"REDIS_URL": redis7.url, **settings}, named, reason)


def test_a_redis_spider_with_good_settings_still_starts(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """(the test above can fail: the same spider, nothing wrong, closes idle with exit 0)"""
    settings = {
        **SCHEDULER,
        "REDIS_URL": redis7.url,
        "REDCRAWL_CRAWL": "refusal-ok",
        "MAX_IDLE_TIME_BEFORE_CLOSE": "1",
        "LOG_LEVEL": "INFO",
    }
    code, text = _run(tmp_path, "%(name)s:start_urls", settings)
    assert code == 0, text[-3000:]
    assert "] CRITICAL:" not in text, text[-3000:]


PIPELINE = {"ITEM_PIPELINES": '{"redcrawl.scrapy.pipelines.UpsertPipeline": 300}'}


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({**SCHEDULER, **PIPELINE, "REDCRAWL_LEASE_TTTL": "5"}, "REDCRAWL_LEASE_TTTL"),
        ({**SCHEDULER, **PIPELINE, "DOWNLOAD_DELAY": "-1"}, "DOWNLOAD_DELAY"),
        ({**SCHEDULER, **PIPELINE, "REDCRAWL_ITEMS_URI": "mysql://x/y"}, "REDCRAWL_ITEMS_URI"),
        # the pipeline alone, on Scrapy's own scheduler: its refusal closes the crawl
        ({**PIPELINE, "REDCRAWL_ITEMS_URI": "mysql://x/y"}, "REDCRAWL_ITEMS_URI"),
    ],
)
def test_a_wrong_setting_with_the_upsert_pipeline_is_one_critical_line(
    redis7: RedisServer, tmp_path: Path, settings: dict[str, str], named: str
) -> None:
    """The pipeline read the same settings when the engine was built and its ConfigError
    ended as asyncio's "Task exception was never retrieved" with a traceback, after the
    spider's CRITICAL line; the engine never started, so the spider closed as
    'finished' (a monitor reading finish_reason was told all was well)."""
    settings = {"REDIS_URL": redis7.url, **settings}
    _refused(tmp_path, "%(name)s:start_urls", settings, named, "config_error")
