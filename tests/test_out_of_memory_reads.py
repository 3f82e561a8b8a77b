"""A Redis out of memory (``maxmemory`` reached, ``noeviction``) refuses writes, and also
every command queued in a MULTI, reads included: the counts an operator needs right
then (``redcrawl status``, the API, a worker's "finished" check) must still be readable."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from redcrawl.envelope import Envelope
from redcrawl.frontier.streams import StreamsFrontier
from tests.conftest import FrontierFactory, RedisServer


@pytest.fixture
def out_of_memory(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """The test server made full after the test's setup (call ``fill()``); restored after."""
    before = str(redis_client.config_get("maxmemory")["maxmemory"])
    yield redis_client
    redis_client.config_set("maxmemory", before)


def _fill(client: redis.Redis) -> None:
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set("rc:test:oom", "x")  # full indeed


@pytest.mark.parametrize("politeness", ["off", "on"])
def test_counts_are_read_while_redis_is_out_of_memory(
    make_frontier: FrontierFactory, out_of_memory: redis.Redis, politeness: str
) -> None:
    f = make_frontier(politeness=politeness)
    f.push([Envelope(url=f"https://site{i % 3}.test/{i}") for i in range(6)])
    leased = f.lease("w1", 2)
    assert len(leased) == 2
    expected = f.counts()
    _fill(out_of_memory)
    counts = f.counts()
    assert counts == expected
    assert (counts.ready, counts.in_flight) == (4, 2)


def test_inspection_and_listing_while_redis_is_out_of_memory(
    make_frontier: FrontierFactory, out_of_memory: redis.Redis
) -> None:
    """What ``redcrawl status``, ``crawls`` and ``describe`` read (seen in a user trial:
    ``status`` said "Redis refused politeness_stats", ``crawls`` printed a traceback)."""
    from redcrawl.frontier.base import format_id
    from redcrawl.keys import crawl_registry
    from redcrawl.metrics.registry import all_crawls

    f = make_frontier(crawl="full")
    f.push([Envelope(url=f"https://site{i % 3}.test/{i}") for i in range(4)])
    (lease,) = f.lease("w1", 1)
    out_of_memory.delete(crawl_registry("rc"))  # the registry rebuilt by a SCAN, then adopted
    _fill(out_of_memory)
    assert "full" in all_crawls(out_of_memory, "rc")
    assert f.politeness_stats()["blocked"] == 0
    info = f.describe(format_id(lease.id))
    assert info is not None and info.state == "in_flight"
    if isinstance(f, StreamsFrontier):
        assert f.shards()


def test_status_says_redis_is_out_of_memory(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """The counts, and the reason the workers stopped, in one command."""
    from typer.testing import CliRunner

    from redcrawl.cli import app

    seeded = CliRunner().invoke(
        app, ["seed", "https://a.example/", "--redis-url", redis7.url, "--crawl", "full"]
    )
    assert seeded.exit_code == 0, seeded.output
    before = str(redis7_client.config_get("maxmemory")["maxmemory"])
    try:
        _fill(redis7_client)
        shown = CliRunner().invoke(app, ["status", "--redis-url", redis7.url, "--crawl", "full"])
        as_json = CliRunner().invoke(
            app, ["status", "--redis-url", redis7.url, "--crawl", "full", "--json"]
        )
    finally:
        redis7_client.config_set("maxmemory", before)
    assert shown.exit_code == 0, shown.output
    assert "warning: Redis uses" in shown.output and "maxmemory" in shown.output, shown.output
    assert "ready" in shown.output
    assert "maxmemory" in json.loads(as_json.output)["memory_warning"]
