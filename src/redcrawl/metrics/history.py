"""The last hour of a crawl's counters, kept in Redis at one sample per minute
(:attr:`~redcrawl.keys.CrawlKeys.history`): written by every ``/metrics`` scrape and every
dashboard page read (so the dashboard has history while Prometheus scrapes, even when
nobody looks), read by the dashboard's sparklines."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from redcrawl.keys import HISTORY_MINUTES, HISTORY_TTL, CrawlKeys
from redcrawl.metrics.snapshot import CrawlSnapshot
from redcrawl.settings import Settings

__all__ = ["Series", "record_history"]

log = logging.getLogger(__name__)

Series = list[tuple[int, int, int]]
"""(epoch minute, done, accepted), oldest first, one per minute."""


def record_history(
    client: Any,
    settings: Settings,
    crawls: Sequence[CrawlSnapshot],
    now: float,
    *,
    read: bool = True,
) -> dict[str, Series]:
    """Record this minute's sample of each crawl (the latest one of a minute wins; older
    than :data:`HISTORY_MINUTES` dropped; the key expires :data:`HISTORY_TTL` after its
    last write) and, with ``read``, return each crawl's series. One pipelined round trip,
    4 commands per crawl (5 with ``read``)."""
    minute = int(now // 60)
    per = 5 if read else 4
    pipe = client.pipeline(transaction=False)
    for c in crawls:
        key = CrawlKeys(c.crawl, prefix=settings.key_prefix, tiers=settings.tiers).history
        pipe.zremrangebyscore(key, minute, minute)
        pipe.zadd(key, {f"{minute}:{c.counts.done}:{c.counts.accepted}": minute})
        pipe.zremrangebyscore(key, "-inf", minute - HISTORY_MINUTES)
        pipe.expire(key, HISTORY_TTL)
        if read:
            pipe.zrange(key, 0, -1)
    res = pipe.execute(raise_on_error=False)
    out: dict[str, Series] = {}
    for i, c in enumerate(crawls):
        members = res[per * i + 4] if read else []
        series: dict[int, tuple[int, int, int]] = {}
        for m in members if isinstance(members, list) else []:
            try:
                t, d, a = (int(x) for x in m.decode().split(":"))
            except (ValueError, AttributeError):
                continue  # not ours: ignore
            series[t] = (t, d, a)
        out[c.crawl] = [series[t] for t in sorted(series)]
    return out
