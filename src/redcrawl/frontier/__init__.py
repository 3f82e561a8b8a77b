"""The crawl frontier: a request state machine on Redis.

:class:`FrontierCore` (also exported as ``Frontier``) is the interface and everything the
backends share (:mod:`.core`); :class:`ListsFrontier` (:mod:`.lists`) and
:class:`StreamsFrontier` (:mod:`.streams`) are its two queue layers, siblings;
:class:`PartitionedFrontier` (:mod:`.partitioned`) composes one per partition. The
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
from redcrawl.frontier.partitioned import (
    PartitionedFrontier,
    anchor_lost,
    anchor_partitions,
    mismatch,
    partitioned_class,
    partitions_left,
)
from redcrawl.frontier.records import stored_layout
from redcrawl.frontier.settle import PendingSettle
from redcrawl.frontier.streams import StreamsFrontier
from redcrawl.keys import CrawlKeys
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
    "PartitionedFrontier",
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
    (``REDCRAWL_BACKEND``): a :class:`ListsFrontier` or a :class:`StreamsFrontier`, or with
    ``REDCRAWL_PARTITIONS`` > 1 a :class:`PartitionedFrontier` of them, all
    :class:`FrontierCore` (the interface callers type against). A worker whose
    ``REDCRAWL_PARTITIONS`` is not the one the crawl was created with is refused with
    :class:`~redcrawl.errors.LayoutMismatch`.

    With ``follow_layout`` an existing crawl is opened with the backend (and shard count
    or ordering) it was created with, whatever ``settings`` say: for tools that serve
    every crawl, like the HTTP API (the partition count too). Workers don't follow: one
    with another layout is refused with an error naming the settings."""
    anchor = CrawlKeys(crawl, prefix=settings.key_prefix, tiers=settings.tiers)
    with redis_errors("reading the crawl layout"):
        control: Any = client.hgetall(anchor.control)
    created = anchor_partitions(control)
    if follow_layout:
        if created is not None:
            settings = settings.replace(partitions=created)
        if settings.partitions > 1:
            with redis_errors("reading the crawl layout"):
                control = client.hgetall(anchor.part(0).control)
        settings = _created_layout(control, settings, crawl)
    elif settings.partitions == 1 and created not in (None, 1):
        raise mismatch(crawl, created or 1, 1)
    elif settings.partitions == 1 and created is None:  # a new crawl, or a lost anchor
        left = partitions_left(client, anchor, LOST_ANCHOR_PROBE)
        if left:
            raise anchor_lost(crawl, partitions_left(client, anchor), 1)
    if settings.partitions > 1:
        return partitioned_class(settings.backend)(client, settings, crawl, clock=clock)
    cls: type[FrontierCore] = StreamsFrontier if settings.backend == "streams" else ListsFrontier
    return cls(client, settings, crawl, clock=clock)


LOST_ANCHOR_PROBE = 16
"""Partitions a one-partition worker looks for when it opens a new crawl (a partitioned
crawl whose anchor was lost still has most of its first 16 partitions)."""


def _created_layout(control: Any, settings: Settings, crawl: str) -> Settings:
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
