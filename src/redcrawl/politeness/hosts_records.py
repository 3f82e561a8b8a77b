"""The records, bounds and input checks of :mod:`redcrawl.politeness.hosts` (the operators'
view and steering of politeness keys): :class:`HostRow`, :class:`HostPage`,
:class:`HostDetail`, :class:`Limit`, :class:`RobotsState`; :class:`BadHostInput` naming
the field an operator got wrong, :class:`PolitenessOff`; :func:`check_key`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final, Literal

from redcrawl.errors import FrontierError, RedcrawlError
from redcrawl.politeness.key import MAX_KEY_BYTES

__all__ = [
    "LIST_KEYS_PER_TIER",
    "LIST_LEASED_IDS",
    "LIST_LEASES",
    "LIST_STEP_IDS",
    "MAX_BLOCK",
    "MAX_CONCURRENCY",
    "MAX_DELAY",
    "OPERATOR_FIELDS",
    "PAST_BLOCK",
    "SHOW_MANY",
    "UNSET",
    "BadHostInput",
    "HostDetail",
    "HostPage",
    "HostRow",
    "Limit",
    "PolitenessOff",
    "RobotsState",
    "Sort",
    "Source",
    "check_key",
]

MAX_DELAY = 86400.0
"""Longest delay an operator may set for a key: a day (seconds)."""
MAX_CONCURRENCY = 10_000
"""Most requests of one key in flight an operator may allow."""
MAX_BLOCK = 30 * 86400.0
"""Longest block: 30 days from now (seconds)."""
PAST_BLOCK = 86400.0
"""A ``block_until`` more than this long ago (seconds) is refused as a mistake (to lift a
block, remove it: ``unblock``, or ``block_until: null``)."""
LIST_KEYS_PER_TIER = 1000
"""Most keys :meth:`Hosts.top` reads from each tier's ``open`` zset (those that open
first); beyond that the list is a bounded sample (``complete`` false). A partitioned
crawl reads ``1/P`` of this (and of the two bounds below) in each partition, at least
100 keys (100 leases, 1,000 leased ids)."""
LIST_LEASES = 1000
"""Most leases :meth:`Hosts.top` reads (soonest deadline first)."""
LIST_LEASED_IDS = 10_000
"""Most leased requests :meth:`Hosts.top` reads the keys of."""
LIST_STEP_IDS = 1000
"""Most leased requests' records one step of :meth:`Hosts.top` reads (one Lua call: a few
milliseconds of Redis at most)."""
SHOW_MANY = 1000
"""Most keys :meth:`Hosts.show_many` reads in one call (one pipeline)."""
OPERATOR_FIELDS: Final = ("delay", "concurrency", "block_until", "paused")
"""The override's fields operators own; ``crawl_delay`` (robots.txt) is its producer's,
and a reset keeps it (as anything else a producer wrote there)."""
FULL = 2**52
"""The ``open`` score of a key whose slots are all taken (``OPEN_FULL`` in Lua)."""

Source = Literal["default", "DOWNLOAD_SLOTS", "override", "crawl_delay", "auto_delay"]
Sort = Literal["ready", "inflight"]


class _Unset(Enum):
    UNSET = "UNSET"


UNSET: Final = _Unset.UNSET
"""A field left as it is (``None`` removes it from the override)."""


class BadHostInput(RedcrawlError, ValueError):
    """A value an operator gave cannot be used; :attr:`field` names it (``key``,
    ``delay``, ``concurrency``, ``block_until``, ``block_for``, ``cursor``...)."""

    def __init__(self, field: str, problem: str) -> None:
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")


class PolitenessOff(FrontierError):
    """The crawl has no fleet-wide politeness (it was created without it): there are no
    per-key limits to see or steer."""


@dataclass(frozen=True, slots=True)
class Limit:
    """An effective limit of a key and where it comes from."""

    value: float
    source: Source


@dataclass(frozen=True, slots=True)
class RobotsState:
    """The fleet's cached robots.txt of one origin of the key (``status`` 0: its
    download failed; ``kind`` as :attr:`RobotsEntry.kind`)."""

    origin: str
    status: int | None
    kind: str | None
    expires_at: float | None


@dataclass(frozen=True, slots=True)
class HostRow:
    """One politeness key in :meth:`Hosts.top`. Times are seconds since the epoch on the
    Redis clock; ``blocked_until`` is the later of the operator's and the adaptive block
    (429/503), None when neither is in the future."""

    key: str
    ready: int
    ready_per_tier: tuple[int, ...]
    in_flight: int
    next_allowed: float | None
    blocked_until: float | None
    paused: bool


@dataclass(frozen=True, slots=True)
class HostPage:
    """A page of :meth:`Hosts.top`: ``hosts`` sorted by ``sort`` (descending, then by
    key), ``next_cursor`` for the next page (None: last), ``scanned`` keys read and
    whether that was every key with ready work or in flight (``complete``)."""

    crawl: str
    sort: Sort
    hosts: list[HostRow]
    next_cursor: str | None
    scanned: int
    complete: bool
    server_time: float


@dataclass(frozen=True, slots=True)
class HostDetail:
    """One politeness key: its numbers, effective limits with their sources, the
    operator's override, blocks, robots.txt, and in words why it is not served now
    (``why`` None: it is open, the next lease takes it)."""

    crawl: str
    key: str
    ready: int
    ready_per_tier: tuple[int, ...]
    in_flight: int
    concurrency: Limit
    delay: Limit
    randomize_delay: bool
    next_allowed: float | None
    block_until: float | None
    block: float | None
    backoff_failures: int | None
    paused: bool
    crawl_paused: bool
    override: dict[str, Any]
    crawl_delay: float | None
    auto_delay: float | None
    robots: list[RobotsState]
    why: str | None
    server_time: float
    notes: list[str] = field(default_factory=list)


def check_key(key: Any) -> str:
    """``key`` if it can be a politeness key (a non-empty string of at most
    :data:`MAX_KEY_BYTES` UTF-8 bytes without control characters), else
    :class:`BadHostInput`."""
    if not isinstance(key, str) or not key:
        raise BadHostInput("key", "give a politeness key: a host name such as example.com")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadHostInput("key", "it is not valid text (a lone surrogate)") from None
    if size > MAX_KEY_BYTES:
        raise BadHostInput(
            "key",
            f"{size} bytes; a politeness key has at most {MAX_KEY_BYTES} (longer keys are "
            "stored shortened: copy the key as `redcrawl hosts` lists it)",
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        raise BadHostInput("key", "it has control characters; no politeness key has any")
    return key


def check_delay(value: Any) -> float:
    """An override's delay (seconds, 0 to :data:`MAX_DELAY`), else :class:`BadHostInput`."""
    return _number("delay", value, 0, MAX_DELAY)


def check_concurrency(value: Any) -> int:
    """An override's concurrency (1 to :data:`MAX_CONCURRENCY`), else :class:`BadHostInput`."""
    return int(_number("concurrency", value, 1, MAX_CONCURRENCY, whole=True))


def check_block_for(value: Any) -> float:
    """A block's length (seconds, 1 ms to :data:`MAX_BLOCK`), else :class:`BadHostInput`."""
    return _number("block_for", value, 0.001, MAX_BLOCK)


def _number(name: str, value: Any, low: float, high: float, *, whole: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadHostInput(name, f"{value!r} is not a number")
    if not math.isfinite(value):
        raise BadHostInput(name, f"{value!r}: give a finite number")
    if whole and value != int(value):
        raise BadHostInput(name, f"{value!r}: give a whole number")
    if not low <= value <= high:
        give = f"{_num(low)} or more" if high == math.inf else f"{_num(low)} to {_num(high)}"
        raise BadHostInput(name, f"{value!r} is out of range: give {give}")
    return float(value)


def _num(x: float) -> str:
    return f"{int(x):,}" if x == int(x) else f"{x:g}"
