"""The hosts panel of ``redcrawl top`` and of a crawl's dashboard page: the top politeness
keys of one crawl with their limits and why each is not served now, read through
:class:`redcrawl.politeness.hosts.Hosts` (the library the API and ``redcrawl hosts``
call), so the three views agree.

Cost, bounded whatever the crawl's size: one :meth:`Hosts.top` (a read-only Lua step
over at most ``LIST_KEYS_PER_TIER`` keys of each tier's ``open`` zset and the keys of at
most ``LIST_LEASED_IDS`` leased requests, then their numbers pipelined), then one
:meth:`Hosts.show_many` of the listed keys (one pipelined round trip for all of them). Not read by
``/metrics``: a scrape stays at a few commands per crawl (docs/metrics.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from redcrawl.frontier import FrontierCore
from redcrawl.politeness.hosts import Hosts, PolitenessOff, Sort

__all__ = ["TOP_HOSTS", "HostLine", "HostsPanel", "read_hosts"]

TOP_HOSTS: Final = 10
"""Keys shown by default (``redcrawl top --hosts``, the dashboard's hosts table)."""
MAX_HOSTS: Final = 100
"""Most keys one panel shows (their details: one :meth:`Hosts.show_many`)."""


@dataclass(frozen=True, slots=True)
class HostLine:
    """One key of the panel. ``delay`` (seconds) and ``concurrency`` are the effective
    limits (None: the key could not be shown, e.g. a stored key with control
    characters); ``blocked_until`` (seconds since the epoch, Redis clock) the later of
    the operator's and the 429/503 block, None when neither is ahead; ``why`` in words
    why it is not served right now (None: open, the next lease takes it)."""

    key: str
    ready: int
    in_flight: int
    delay: float | None
    delay_source: str | None
    concurrency: int | None
    blocked_until: float | None
    paused: bool
    why: str | None


@dataclass(frozen=True, slots=True)
class HostsPanel:
    """The top keys by ``sort``; ``more`` when more keys were found than shown;
    ``scanned`` keys read and whether that was every key with ready work or in flight
    (``complete``; if not, "top" is among the keys that open first and those in
    flight: docs/politeness.md)."""

    sort: Sort
    hosts: list[HostLine]
    more: bool
    scanned: int
    complete: bool
    server_time: float


def read_hosts(
    frontier: FrontierCore, *, limit: int = TOP_HOSTS, sort: Sort = "ready"
) -> HostsPanel | None:
    """The hosts panel of the crawl of ``frontier`` (opened with the crawl's own
    layout), or None when the crawl has no fleet-wide politeness."""
    try:
        hosts = Hosts(frontier)
    except PolitenessOff:
        return None
    page = hosts.top(limit=max(1, min(limit, MAX_HOSTS)), sort=sort)
    details = hosts.show_many([row.key for row in page.hosts])
    lines = []
    for row in page.hosts:
        d = details.get(row.key)
        lines.append(
            HostLine(
                key=row.key,
                ready=row.ready,
                in_flight=row.in_flight,
                # a stored key show_many refuses (control characters): its row's numbers only
                delay=d.delay.value if d is not None else None,
                delay_source=d.delay.source if d is not None else None,
                concurrency=int(d.concurrency.value) if d is not None else None,
                blocked_until=row.blocked_until,
                paused=row.paused,
                why=d.why if d is not None else None,
            )
        )
    return HostsPanel(
        sort=page.sort,
        hosts=lines,
        more=page.next_cursor is not None,
        scanned=page.scanned,
        complete=page.complete,
        server_time=page.server_time,
    )
