"""The boundary between redcrawl and the Redis client: every Redis call a component makes
runs inside :func:`redis_errors`, which turns redis-py's exceptions into redcrawl's
(:mod:`redcrawl.errors`), the way httpx maps its transport's exceptions in one place.

Callers above this line (the Scrapy components, the API, the CLI) catch
:class:`~redcrawl.errors.RedcrawlError` subclasses only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis.exceptions

from redcrawl.errors import ConnectionLost, FrontierError

__all__ = ["TRANSIENT", "redis_errors"]

TRANSIENT = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
"""The client exceptions that mean the connection, not the command, failed."""


@contextmanager
def redis_errors(what: str) -> Iterator[None]:
    """Convert Redis client exceptions raised during ``what`` into redcrawl's errors:
    a lost connection into :class:`ConnectionLost`, a refused command (``ResponseError``,
    which includes a script's ``error_reply``) into :class:`FrontierError`."""
    try:
        yield
    except TRANSIENT as exc:
        raise ConnectionLost(
            f"lost the Redis connection during {what} and the retries ran out ({exc}); "
            "nothing was acknowledged that was not stored — restart the worker when Redis is "
            "back and expired leases will be handed out again"
        ) from exc
    except redis.exceptions.ResponseError as exc:
        raise FrontierError(f"Redis refused {what}: {exc}") from exc
