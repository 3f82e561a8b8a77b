"""The crawl frontier: a request state machine on Redis.

:class:`FrontierCore` (also exported as ``Frontier``) is the interface and everything the
backends share (:mod:`.core`); :class:`ListsFrontier` (:mod:`.lists`) and
:class:`StreamsFrontier` (:mod:`.streams`) are its two queue layers, siblings. The
records it returns are in :mod:`.base`; docs/frontier.md has the layout, file by file."""

from collections.abc import Callable
from typing import Any

import redis

from redcrawl.errors import ConfigError, FrontierError
from redcrawl.frontier.base import (
    Counts,
    DeadInfo,
    InflightInfo,
    Lease,
    PendingInfo,
    PushResult,
    RequestInfo,
    SettleCall,
    Settled,
)
from redcrawl.frontier.core import FrontierCore
from redcrawl.frontier.lists import ListsFrontier
from redcrawl.frontier.records import stored_layout
from redcrawl.frontier.settle import PendingSettle
from redcrawl.frontier.streams import StreamsFrontier
from redcrawl.settings import Settings
from redcrawl.transport import redis_errors

__all__ = [
    "Counts",
    "DeadInfo",
    "Frontier",
    "FrontierCore",
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

Frontier = FrontierCore
"""The frontier interface: what :func:`open_frontier` returns, whichever the backend."""


def open_frontier(
    client: redis.Redis,
    settings: Settings,
    crawl: str,
    *,
    clock: Callable[[], int] | None = None,
    follow_layout: bool = False,
) -> FrontierCore:
    """The frontier of ``crawl`` with the backend ``settings.backend`` chooses
    (``REDCRAWL_BACKEND``): a :class:`ListsFrontier` or a :class:`StreamsFrontier`, both
    :class:`FrontierCore` (the interface callers type against).

    With ``follow_layout`` an existing crawl is opened with the backend (and shard count
    or ordering) it was created with, whatever ``settings`` say: for tools that serve
    every crawl, like the HTTP API. Workers don't follow: one with another layout is
    refused with an error naming the settings."""
    if follow_layout:
        settings = _created_layout(client, settings, crawl)
    cls: type[FrontierCore] = StreamsFrontier if settings.backend == "streams" else ListsFrontier
    return cls(client, settings, crawl, clock=clock)


def _created_layout(client: redis.Redis, settings: Settings, crawl: str) -> Settings:
    from redcrawl.keys import CrawlKeys

    key = CrawlKeys(crawl, prefix=settings.key_prefix, tiers=settings.tiers).control
    with redis_errors("reading the crawl layout"):
        control: Any = client.hgetall(key)
    raw = stored_layout(control)
    head = raw.decode(errors="replace").split(" ", 1)[0] if raw else ""
    shards, _, mode = head[8:].partition("/")
    if head.startswith("streams/") and shards.isdigit():
        try:
            if mode in ("host", "domain"):  # a streams crawl with politeness
                return settings.replace(
                    backend="streams",
                    shards=int(shards),
                    ordering="fifo",
                    politeness=True,
                    politeness_key=mode,
                )
            return settings.replace(
                backend="streams", shards=int(shards), ordering="fifo", politeness=False
            )
        except ConfigError as exc:
            raise FrontierError(
                f"crawl {crawl!r}: its stored layout {raw!r} is not one "
                f"redcrawl can open ({exc}); purge the crawl"
            ) from exc
    if head in ("fifo", "lifo", "priority"):
        return settings.replace(backend="lists", ordering=head, politeness=False)
    order, _, mode = head.partition("/")
    if order in ("fifo", "lifo", "priority") and mode in ("host", "domain"):
        return settings.replace(
            backend="lists", ordering=order, politeness=True, politeness_key=mode
        )
    return settings
