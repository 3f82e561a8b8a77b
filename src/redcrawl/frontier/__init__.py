"""The crawl frontier: a request state machine on Redis. See :mod:`.base` for the interface."""

from collections.abc import Callable
from typing import Any

import redis

from redcrawl.errors import ConfigError, FrontierError
from redcrawl.frontier.base import (
    Counts,
    DeadInfo,
    Frontier,
    InflightInfo,
    Lease,
    PendingInfo,
    PushResult,
    RequestInfo,
    SettleCall,
    Settled,
)
from redcrawl.frontier.lists import ListsFrontier, PendingSettle, stored_layout
from redcrawl.frontier.streams import StreamsFrontier
from redcrawl.settings import Settings
from redcrawl.transport import redis_errors

__all__ = [
    "Counts",
    "DeadInfo",
    "Frontier",
    "InflightInfo",
    "Lease",
    "ListsFrontier",
    "PendingInfo",
    "PendingSettle",
    "PushResult",
    "RequestInfo",
    "SettleCall",
    "Settled",
    "StreamsFrontier",
    "open_frontier",
]


def open_frontier(client: redis.Redis, settings: Settings, crawl: str, *,
                  clock: Callable[[], int] | None = None,
                  follow_layout: bool = False) -> ListsFrontier:
    """The frontier of ``crawl`` with the backend ``settings.backend`` chooses
    (``REDCRAWL_BACKEND``): :class:`ListsFrontier` or :class:`StreamsFrontier` (which
    extends it, so every caller gets the lists backend's full API either way).

    With ``follow_layout`` an existing crawl is opened with the backend (and shard count
    or ordering) it was created with, whatever ``settings`` say: for tools that serve
    every crawl, like the HTTP API. Workers don't follow: one with another layout is
    refused with an error naming the settings."""
    if follow_layout:
        settings = _created_layout(client, settings, crawl)
    cls = StreamsFrontier if settings.backend == "streams" else ListsFrontier
    return cls(client, settings, crawl, clock=clock)


def _created_layout(client: redis.Redis, settings: Settings, crawl: str) -> Settings:
    from redcrawl.keys import CrawlKeys

    key = CrawlKeys(crawl, prefix=settings.key_prefix, tiers=settings.tiers).control
    with redis_errors("reading the crawl layout"):
        control: Any = client.hgetall(key)
    raw = stored_layout(control)
    head = raw.decode(errors="replace").split(" ", 1)[0] if raw else ""
    if head.startswith("streams/") and head[8:].isdigit():
        try:
            return settings.replace(backend="streams", shards=int(head[8:]), ordering="fifo")
        except ConfigError as exc:
            raise FrontierError(f"crawl {crawl!r}: its stored layout {raw!r} is not one "
                                f"redcrawl can open ({exc}); purge the crawl") from exc
    if head in ("fifo", "lifo", "priority"):
        return settings.replace(backend="lists", ordering=head)
    return settings
