"""An outside tester's findings on ``redcrawl import-scrapy-redis``: the most common
scrapy-redis crawl (its project never set SCHEDULER_QUEUE_CLASS, so scrapy-redis used its
default PriorityQueue: a sorted set) was refused as "not a fifo queue", and bare class
names (``--queue-class PriorityQueue``) were "not a scrapy-redis queue class"."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from scrapy import Request
from typer.testing import CliRunner

from redcrawl.cli import app
from redcrawl.frontier import open_frontier
from redcrawl.settings import Settings

from .conftest import RedisServer
from .test_import_scrapy_redis import sr_entry

runner = CliRunner()


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No Scrapy project, no REDCRAWL_* setting: redcrawl's defaults (ordering fifo)."""
    monkeypatch.chdir(tmp_path)
    for name in ("REDCRAWL_REDIS_URL", "REDCRAWL_CRAWL", "REDCRAWL_ORDERING", "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)
    return tmp_path


@pytest.mark.parametrize("given", [[], ["--queue-class", "PriorityQueue"]], ids=["none", "bare"])
def test_a_priority_queue_is_imported_without_naming_its_class(
    here: Path, redis7: RedisServer, redis7_client: redis.Redis, given: list[str]
) -> None:
    redis7_client.zadd(
        "srs:requests",
        {sr_entry(Request("http://a.example/1")): 0, sr_entry(Request("http://a.example/2")): -5},
    )
    args = ["import-scrapy-redis", "srs", "--redis-url", redis7.url, *given]
    dry = runner.invoke(app, [*args, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "(zset, priority): 2 read, 2 would be queued" in dry.output, dry.output
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    assert open_frontier(redis7_client, Settings(), "srs").counts().ready == 2


@pytest.mark.parametrize("name", ["LifoQueue", "scrapy_redis.queue.LifoQueue"])
def test_a_list_queue_takes_a_bare_or_a_full_class_name(
    here: Path, redis7: RedisServer, redis7_client: redis.Redis, name: str
) -> None:
    for n in (1, 2):
        redis7_client.lpush("srs:requests", sr_entry(Request(f"http://a.example/{n}")))
    args = ["import-scrapy-redis", "srs", "--redis-url", redis7.url, "--dry-run"]
    result = runner.invoke(app, [*args, "--queue-class", name])
    assert result.exit_code == 0, result.output
    assert "(list, lifo): 2 read" in result.output
    fifo = runner.invoke(app, args)  # a list without a class: the project's, else FIFO
    assert fifo.exit_code == 0 and "(list, fifo): 2 read" in fifo.output, fifo.output
    bad = runner.invoke(app, [*args, "--queue-class", "Nope"])
    assert bad.exit_code == 2 and "not a scrapy-redis queue class" in bad.output
