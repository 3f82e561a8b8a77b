"""`redcrawl status` of a crawl that does not exist (never made, or purged) says so and
exits 1, as the API answers 404 (the shared rule :func:`redcrawl.metrics.registry.alive`)."""

from __future__ import annotations

import redis
from typer.testing import CliRunner

from redcrawl.cli import app

from .conftest import RedisServer


def test_status_of_a_purged_crawl_says_it_does_not_exist(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    redis7_client.flushall()
    runner = CliRunner()
    url = redis7.url
    for crawl in ("kept", "gone"):
        seeded = runner.invoke(
            app, ["seed", "https://a.example/1", "--redis-url", url, "--crawl", crawl]
        )
        assert seeded.exit_code == 0, seeded.output
    purged = runner.invoke(app, ["purge", "--yes", "--redis-url", url, "--crawl", "gone"])
    assert purged.exit_code == 0, purged.output
    for crawl in ("gone", "never"):
        for extra in ([], ["--json"]):
            status = runner.invoke(app, ["status", *extra, "--redis-url", url, "--crawl", crawl])
            out = " ".join(status.output.split())
            assert status.exit_code == 1, out
            assert f"error: no crawl named {crawl!r}" in out and "crawls there: kept" in out, out
