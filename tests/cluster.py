"""A real Redis Cluster for the tests: 3 masters and 3 replicas on loopback
(:class:`redcrawl.redis_server.LocalCluster`), and clients of it.

The ``redis_cluster`` fixture (tests/conftest.py) starts one through :func:`start` once
per test session and kills it (by pid) at the session's end; a test that kills nodes
(tests/test_cluster_failover.py) starts a cluster of its own. A missing ``redis-cli`` or
Redis 7 is :func:`~tests.conftest.need` (a skip locally, a failure in CI).
"""

from __future__ import annotations

from pathlib import Path

import redis

from redcrawl.connection import connect
from redcrawl.redis_server import LocalCluster, cli_binary, find_binary
from redcrawl.settings import Settings

__all__ = ["NODE_TIMEOUT", "client", "start"]

NODE_TIMEOUT = 2000
"""The cluster's ``cluster-node-timeout`` (ms): a dead master's replica takes over after
about this long."""


def start(directory: Path) -> LocalCluster:
    """A 3-master, 3-replica cluster with its data under ``directory``."""
    from .conftest import need

    binary = find_binary("7")
    if binary is None:
        need("redis-server 7", "install Debian's redis-server")
    if cli_binary(binary) is None:
        need("redis-cli", "install Debian's redis-tools")
    return LocalCluster(binary, directory, masters=3, replicas=1, node_timeout=NODE_TIMEOUT)


def client(cluster: LocalCluster, **settings: object) -> redis.Redis:
    """A redcrawl client of ``cluster`` (``redis+cluster://`` URL, a ClusterClient),
    after every master's data was flushed."""
    c = connect(Settings(redis_url=cluster.url, **settings))  # type: ignore[arg-type]
    c.flushall()
    return c
