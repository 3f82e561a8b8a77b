"""Orphan leases taken back (``disown``, after a failover to a lagging replica) are a
crawl-wide counter: ``redcrawl_requests_orphaned_total`` in /metrics and ``orphaned`` in
``redcrawl status``, on one partition and summed over partitions."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
import redis
from typer.testing import CliRunner

from redcrawl.frontier import FrontierCore, Lease, open_frontier
from redcrawl.settings import Settings

from .apikit import AUTH_READ, ApiServer, api_settings
from .conftest import Backend, RedisServer
from .partition_helpers import hosts_in
from .test_disown import promote_lagging, snapshot
from .test_metrics import env, samples, value


@pytest.fixture
def api_server(redis7: RedisServer, redis7_client: redis.Redis) -> Iterator[ApiServer]:
    server = ApiServer(api_settings(redis7.url), redis7_client)
    yield server
    server.stop()


def orphans(f: FrontierCore, urls: list[str]) -> None:
    """``urls`` (pushed) leased by w1, acked, the acks undone by a failover (the lagging
    replica: a snapshot restored), then taken back by w1's disown."""
    held: list[Lease] = []
    for _ in range(20):  # (a partitioned lease call asks one partition)
        held += f.lease("w1", len(urls) - len(held))
        if len(held) == len(urls):
            break
    assert len(held) == len(urls)
    snap = snapshot(f.client)
    assert f.ack(held) == len(urls)
    promote_lagging(f.client, snap)
    assert f.disown("w1", []) == len(urls)


@pytest.mark.parametrize("partitions", [1, 4])
def test_orphaned_is_exported_in_metrics_and_status(
    redis7: RedisServer,
    redis7_client: redis.Redis,
    api_server: ApiServer,
    frontier_backend: Backend,
    partitions: int,
) -> None:
    settings = Settings(backend=frontier_backend, politeness=False, partitions=partitions)
    f = open_frontier(redis7_client, settings, "c")
    hosts = [hosts_in(p % partitions, partitions, 1)[0] for p in range(3)]
    urls = [f"http://{h}/x{i}" for i, h in enumerate(hosts)]
    f.push([env(u) for u in urls])
    found = samples(httpx.get(f"{api_server.url}/metrics", headers=AUTH_READ).text)
    assert value(found, "redcrawl_requests_orphaned_total", crawl="c") == 0
    orphans(f, urls)
    found = samples(httpx.get(f"{api_server.url}/metrics", headers=AUTH_READ).text)
    assert value(found, "redcrawl_requests_orphaned_total", crawl="c") == 3

    from redcrawl.cli import app

    env_ = {"REDCRAWL_PARTITIONS": str(partitions), "REDCRAWL_BACKEND": frontier_backend}
    args = ["status", "--redis-url", redis7.url, "--crawl", "c"]
    result = CliRunner().invoke(app, [*args, "--json"], env=env_)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["orphaned"] == 3
    result = CliRunner().invoke(app, args, env=env_)
    assert result.exit_code == 0, result.output
    assert "orphaned leases" in result.output
