"""AutoThrottle on fleet-wide state: Scrapy's update rule, kept in Redis per politeness key.

Scrapy's AutoThrottle (``scrapy.extensions.throttle``) adjusts the delay of each download
slot of one process from the latencies that process sees. Here the delay is one number per
politeness key for the whole fleet: the field ``ad`` (milliseconds) of the key's state hash
(:attr:`redcrawl.keys.CrawlKeys.pol_state_base` + key, which the lease step reads anyway,
and which expires an hour after the key goes idle, so an idle site's delay costs nothing),
updated by
``lua/autothrottle.lua`` with the same rule (:func:`adjust_delay`, its Python reference),
one response after the other, atomically; the frontier's lease step spaces the key's grants
by it (``limits()`` in ``frontier/lua/queue_lists.lua``).

While a worker has AutoThrottle on, the crawl's control hash holds
``autothrottle`` = ``{"start_delay": s}`` (:meth:`FleetThrottle.enable`): the lease step
honours ``ad`` only then, and a key without it is spaced by the start delay, as
Scrapy's new slot is. A worker without AutoThrottle removes the field
(:meth:`FleetThrottle.disable`): the latest worker wins, as for the crawl's other
politeness defaults, and stale ``ad`` values are then ignored.

A partitioned crawl (``REDCRAWL_PARTITIONS`` > 1) keeps a key's ``ad`` in the partition
that owns the key (:func:`owner_keys`), where that partition's lease step reads it, and
the switch in every partition's control hash and the anchor's (one round).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redcrawl.keys import CrawlKeys, partition_of
from redcrawl.scripts import BASE, Scripts
from redcrawl.transport import redis_errors

__all__ = [
    "BATCH",
    "CONTROL_FIELD",
    "STATE_FIELD",
    "Applied",
    "CrawlPartitionsOf",
    "FleetThrottle",
    "ThrottleRule",
    "Update",
    "adjust_delay",
    "crawl_partitions",
    "owner_keys",
    "state_delay",
]

STATE_FIELD = "ad"
"""Field of a key's state hash holding its fleet-wide AutoThrottle delay (ms)."""

CONTROL_FIELD = "autothrottle"
"""Field of the crawl's control hash holding the fleet's AutoThrottle switch (JSON)."""

BATCH = 200
"""Responses applied in one script call (more are split over several, in one pipeline)."""

_SOURCES = {"update": (BASE, "politeness/lua/autothrottle.lua")}


def adjust_delay(
    old: float,
    latency: float,
    status: int,
    *,
    target_concurrency: float,
    min_delay: float,
    max_delay: float,
) -> float:
    """The delay after a response (Scrapy's ``AutoThrottle._adjust_delay``): half-way from
    ``old`` to ``latency / target_concurrency``, never below that target, clamped to
    ``[min_delay, max_delay]``; a response other than 200 never lowers it."""
    target = latency / target_concurrency
    new = max(target, (old + target) / 2.0)
    new = min(max(min_delay, new), max_delay)
    if status != 200 and new <= old:
        return old
    return new


@dataclass(frozen=True, slots=True)
class ThrottleRule:
    """The settings of the rule (``AUTOTHROTTLE_*`` and ``DOWNLOAD_DELAY``)."""

    target_concurrency: float
    min_delay: float
    max_delay: float
    start_delay: float
    """The delay of a key not seen yet: ``max(DOWNLOAD_DELAY, AUTOTHROTTLE_START_DELAY)``."""

    @classmethod
    def from_settings(cls, settings: Any) -> ThrottleRule:
        """From a :class:`redcrawl.settings.Settings`."""
        low = float(settings.politeness_delay)
        return cls(
            target_concurrency=float(settings.autothrottle_target_concurrency),
            min_delay=low,
            max_delay=float(settings.autothrottle_max_delay),
            start_delay=max(low, float(settings.autothrottle_start_delay)),
        )

    def next_delay(self, old: float | None, latency: float, status: int) -> float:
        """:func:`adjust_delay` from ``old`` (None: a key not seen yet)."""
        return adjust_delay(
            self.start_delay if old is None else old,
            latency,
            status,
            target_concurrency=self.target_concurrency,
            min_delay=self.min_delay,
            max_delay=self.max_delay,
        )


@dataclass(frozen=True, slots=True)
class Update:
    """One response: its politeness key, download latency (seconds) and status."""

    key: str
    latency: float
    status: int


@dataclass(frozen=True, slots=True)
class Applied:
    """What an :class:`Update` did to its key's fleet-wide delay."""

    key: str
    outcome: int
    """1 written, 0 unchanged (-1 was: the key's override not a JSON object; the delay
    is no longer kept in the override)."""
    old: float | None
    new: float | None


def owner_keys(keys: CrawlKeys, partitions: int, key: str) -> CrawlKeys:
    """The keys of the partition that owns politeness key ``key`` in a crawl of
    ``partitions`` partitions whose anchor is ``keys`` (``keys`` itself for one)."""
    return keys.part(partition_of(key, partitions)) if partitions > 1 else keys


def crawl_partitions(client: Any, keys: CrawlKeys) -> int | None:
    """The partitions of the crawl of ``keys`` (its anchor's layout: 1 for a crawl of one
    partition), None for a crawl not created yet."""
    from redcrawl.frontier.partitioned import anchor_partitions  # (frontier imports us)

    with redis_errors("reading the crawl layout"):
        return anchor_partitions(client.hgetall(keys.control))


class CrawlPartitionsOf:
    """Base of the Scrapy-side writers of per-site state (AutoThrottle, robots.txt):
    their crawl's partition count, read from the anchor when first needed."""

    client: Any
    keys: CrawlKeys
    _partitions: int | None

    @property
    def partitions(self) -> int:
        """The crawl's partitions (read once from the anchor; 1 until the crawl exists)."""
        if self._partitions is None:
            found = crawl_partitions(self.client, self.keys)
            if found is None:
                return 1
            self._partitions = found
        return self._partitions


def _float(raw: Any) -> float | None:
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return float(text) if text else None


class FleetThrottle(CrawlPartitionsOf):
    """The fleet-wide AutoThrottle state of one crawl, on ``client``; ``keys`` are the
    crawl's (a partitioned crawl's anchor), ``partitions`` its partitions (None: read
    from the anchor's layout when first needed)."""

    def __init__(
        self, client: Any, keys: CrawlKeys, rule: ThrottleRule, *, partitions: int | None = None
    ) -> None:
        for name in ("target_concurrency", "min_delay", "max_delay", "start_delay"):
            value = getattr(rule, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"AutoThrottle {name} must be a number >= 0, not {value!r}")
        if rule.target_concurrency <= 0:
            raise ValueError("AutoThrottle target_concurrency must be above 0")
        self.client = client
        self.keys = keys
        self.rule = rule
        self._partitions = partitions
        self._scripts = Scripts(client, _SOURCES)

    def _controls(self) -> list[str]:
        """The control hashes the switch is in: the crawl's, and each partition's."""
        n = self.partitions
        return [self.keys.control] + [self.keys.part(p).control for p in range(n if n > 1 else 0)]

    def _keys(self, key: str) -> CrawlKeys:
        return owner_keys(self.keys, self.partitions, key)

    def enable(self) -> None:
        """Tell the lease step that the fleet runs AutoThrottle (with this start delay)."""
        value = json.dumps({"start_delay": self.rule.start_delay})
        with redis_errors("switching fleet-wide AutoThrottle on"):
            pipe = self.client.pipeline(transaction=False)
            for control in self._controls():
                pipe.hset(control, CONTROL_FIELD, value)
            pipe.execute()

    def disable(self) -> bool:
        """Tell the lease step to ignore the keys' ``ad``; whether it was on."""
        with redis_errors("switching fleet-wide AutoThrottle off"):
            pipe = self.client.pipeline(transaction=False)
            for control in self._controls():
                pipe.hdel(control, CONTROL_FIELD)
            return any(pipe.execute())

    def update(self, updates: Sequence[Update]) -> list[Applied]:
        """Apply the rule for each response, in order: one script call per :data:`BATCH`
        responses, all in one round trip."""
        if not updates:
            return []
        r = self.rule
        head = [
            repr(r.target_concurrency),
            repr(r.min_delay),
            repr(r.max_delay),
            repr(r.start_delay),
        ]
        groups: dict[str, list[int]] = {}  # state key base -> indexes (in order)
        for i, u in enumerate(updates):
            groups.setdefault(self._keys(u.key).pol_state_base, []).append(i)
        order: list[int] = []
        with redis_errors("AutoThrottle update"):
            pipe = self.client.pipeline(transaction=False)
            for base, idx in groups.items():
                for at in range(0, len(idx), BATCH):
                    args = list(head)
                    for i in idx[at : at + BATCH]:
                        u = updates[i]
                        args += [u.key, repr(float(u.latency)), str(int(u.status))]
                        order.append(i)
                    self._scripts["update"](keys=[base], args=args, client=pipe)
            replies = pipe.execute()
        flat = [x for reply in replies for x in reply]
        out: list[Applied | None] = [None] * len(updates)
        for j, i in enumerate(order):
            u = updates[i]
            out[i] = Applied(
                u.key, int(flat[3 * j]), _float(flat[3 * j + 1]), _float(flat[3 * j + 2])
            )
        return [x for x in out if x is not None]

    def delay(self, key: str) -> float | None:
        """The stored fleet-wide delay of ``key``, seconds (None: none, or unreadable)."""
        with redis_errors("reading a politeness key's state"):
            raw = self.client.hget(self._keys(key).pol_state_base + key, STATE_FIELD)
        return state_delay(raw)


def state_delay(raw: Any) -> float | None:
    """Seconds from a state hash's ``ad`` field (ms), None if absent or unreadable."""
    if raw is None:
        return None
    try:
        ms = float(raw)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(ms) or ms < 0:
        return None
    return ms / 1000
