"""The boundary between redcrawl and the Redis client: every Redis call a component makes
runs inside :func:`redis_errors`, which turns redis-py's exceptions into redcrawl's
(:mod:`redcrawl.errors`), the way httpx maps its transport's exceptions in one place.

Callers above this line (the Scrapy components, the API, the CLI) catch
:class:`~redcrawl.errors.RedcrawlError` subclasses only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis.exceptions

from redcrawl.errors import ConnectionLost, FrontierError, LayoutMismatch, RedisOutOfMemory

__all__ = ["NOT_RUN", "TRANSIENT", "WORKER_ADVICE", "pool_for", "redis_errors"]

TRANSIENT = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
"""The client exceptions that mean the connection, not the command, failed."""

CLUSTER_TRANSIENT = (
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.SlotNotCoveredError,
)
"""A Redis Cluster reconfiguring (a failover, resharding): the command did not run; the
cluster client retries these for a while (:class:`redcrawl.cluster.ClusterClient`)."""

NOT_RUN = (
    redis.exceptions.NoScriptError,
    redis.exceptions.AskError,  # MOVED is one
    *CLUSTER_TRANSIENT,
)
"""Replies that say a command sent on a raw connection did not run there: the server lost
its scripts, or (Redis Cluster) the key's slot is served elsewhere now, or the cluster is
reconfiguring. Run it again through the client, which follows redirections."""


def pool_for(client: Any, key: str) -> Any:
    """The connection pool reaching the server that holds ``key`` now: a client's own
    pool, or for a Redis Cluster client the pool of the master serving ``key``'s slot;
    None when the client has none (commands then go through the client itself)."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        return pool
    node_of = getattr(client, "get_node_from_key", None)
    if node_of is None:
        return None
    node = node_of(key)
    return getattr(getattr(node, "redis_connection", None), "connection_pool", None)


WORKER_ADVICE = (
    "; nothing was acknowledged that was not stored — restart the worker when Redis is "
    "back and expired leases will be handed out again"
)
"""What :func:`redis_errors` tells a worker when the connection is lost (the API strips it:
not for an API caller)."""


@contextmanager
def redis_errors(what: str) -> Iterator[None]:
    """Convert Redis client exceptions raised during ``what`` into redcrawl's errors:
    a lost connection into :class:`ConnectionLost`, a refused command (``ResponseError``,
    which includes a script's ``error_reply``) into :class:`FrontierError`
    (:class:`LayoutMismatch` when the crawl's layout refused this worker's settings,
    :class:`RedisOutOfMemory` when Redis reached its maxmemory)."""
    try:
        yield
    except (*TRANSIENT, *CLUSTER_TRANSIENT) as exc:
        raise ConnectionLost(
            f"lost the Redis connection during {what} and the retries ran out ({exc})"
            + WORKER_ADVICE
        ) from exc
    except redis.exceptions.OutOfMemoryError as exc:  # (a ResponseError: "OOM ...")
        raise RedisOutOfMemory(what, exc) from exc
    except redis.exceptions.ResponseError as exc:
        error = LayoutMismatch if str(exc).startswith(LayoutMismatch.PREFIX) else FrontierError
        raise error(f"Redis refused {what}: {exc}") from exc
