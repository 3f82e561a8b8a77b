"""An outside tester's smaller findings: `serve` on a port in use exited 3 (the code of
"Redis unreachable"); a purged crawl was still listed by `redcrawl crawls` (as "empty")
while the API said 404 and did not list it; "1 workers take up to 1x"."""

from __future__ import annotations

import json
import socket

import redis
from typer.testing import CliRunner

from redcrawl.cli import app
from redcrawl.cli.run import _politeness
from redcrawl.frontier import open_frontier
from redcrawl.settings import Settings

from .conftest import RedisServer

runner = CliRunner()


def test_serve_on_a_port_in_use_is_a_clear_usage_error(redis7: RedisServer) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = runner.invoke(
            app, ["serve", "--redis-url", redis7.url, "--host", "127.0.0.1", "--port", str(port)]
        )
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.split())
    assert out.startswith(f"error: cannot listen on 127.0.0.1:{port}: "), out
    assert "in use" in out and "--port" in out, out


def test_a_purged_crawl_is_not_listed(redis7: RedisServer, redis7_client: redis.Redis) -> None:
    redis7_client.flushall()
    kept = open_frontier(redis7_client, Settings(), "kept")
    gone = open_frontier(redis7_client, Settings(), "gone")
    for f in (kept, gone):
        assert (
            runner.invoke(
                app, ["seed", "https://a.example/1", "--redis-url", redis7.url, "--crawl", f.crawl]
            ).exit_code
            == 0
        )
    assert (
        runner.invoke(
            app, ["purge", "--yes", "--redis-url", redis7.url, "--crawl", "gone"]
        ).exit_code
        == 0
    )
    assert redis7_client.exists(gone.keys.stats)  # its id counters stay (old leases stale)
    listed = runner.invoke(app, ["crawls", "--json", "--redis-url", redis7.url])
    assert listed.exit_code == 0, listed.output
    assert [row["crawl"] for row in json.loads(listed.output)] == ["kept"]
    # nor picked as "the only crawl in the Redis" by another command
    status = runner.invoke(app, ["status", "--json", "--redis-url", redis7.url])
    assert status.exit_code == 0, status.output  # not "which crawl? ...: gone, kept"
    assert json.loads(status.output)["accepted"] == 1


def test_one_worker_is_said_in_the_singular(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    redis7_client.flushall()
    off = _politeness(Settings(redis_url=redis7.url, politeness=False), "one", 1)
    assert "1 worker takes up to CONCURRENT_REQUESTS_PER_DOMAIN" in off, off
    on = _politeness(Settings(redis_url=redis7.url), "one", 1)
    assert on.startswith("per-site limits for the whole fleet (this worker, and any"), on
