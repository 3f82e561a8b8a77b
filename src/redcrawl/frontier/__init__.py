"""The crawl frontier: a request state machine on Redis. See :mod:`.base` for the interface."""

from collections.abc import Callable

import redis

from redcrawl.frontier.base import (
    Counts,
    DeadInfo,
    Frontier,
    InflightInfo,
    Lease,
    PendingInfo,
    PushResult,
    RequestInfo,
    Settled,
)
from redcrawl.frontier.lists import ListsFrontier
from redcrawl.frontier.streams import StreamsFrontier
from redcrawl.settings import Settings

__all__ = [
    "Counts",
    "DeadInfo",
    "Frontier",
    "InflightInfo",
    "Lease",
    "ListsFrontier",
    "PendingInfo",
    "PushResult",
    "RequestInfo",
    "Settled",
    "StreamsFrontier",
    "open_frontier",
]


def open_frontier(client: redis.Redis, settings: Settings, crawl: str, *,
                  clock: Callable[[], int] | None = None) -> ListsFrontier:
    """The frontier of ``crawl`` with the backend ``settings.backend`` chooses
    (``REDCRAWL_BACKEND``): :class:`ListsFrontier` or :class:`StreamsFrontier` (which
    extends it, so every caller gets the lists backend's full API either way)."""
    cls = StreamsFrontier if settings.backend == "streams" else ListsFrontier
    return cls(client, settings, crawl, clock=clock)
