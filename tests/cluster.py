"""A real Redis Cluster for the tests: 3 masters and 3 replicas on loopback, started once
per test session (:class:`redcrawl.redis_server.LocalCluster`), and clients of it.

The ``redis_cluster`` fixture (tests/conftest.py) starts it through :func:`start`; a
missing ``redis-cli`` or Redis 7 is :func:`~tests.conftest.need` (a skip locally, a
failure in CI). The cluster is killed (by pid) when the session ends, and after a test
that broke it (a SIGKILLed master) the next :func:`client` waits until it is whole
again or starts a fresh one.
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
