"""The crawl frontier: a request state machine on Redis. See :mod:`.base` for the interface."""

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
]
