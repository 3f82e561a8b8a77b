"""The lists backend's queue layer (``lua/queue_lists.lua``): ready queues as Redis lists
per tier (or one sorted set for strict priority), leases as sorted sets and hashes.

Layout of one crawl (see :class:`redcrawl.keys.CrawlKeys` and ``lua/lib.lua``): a request
is identified by its fingerprint (or ``#<seq>`` without one) and stored once, in one hash,
as ``<priority>|<attempts>|<lease token>|<msgpack envelope>``; the ready queues and the
delayed and dead sets hold ids. One ``lease()`` call is one lease: a token (a crawl-wide
counter) with a deadline in ``inflight``, the worker and ids in ``leases``, and the
requests it covers carrying that token in their record (in a crawl created since records
keep no lease state, lists crawls without politeness, the lease writes no record: its
entry in ``leases`` says what it holds, see ``FMT`` in ``lua/lib.lua``). Workers heartbeat into
``workers``; a lease past its deadline is extended while its worker's heartbeat is alive,
and its requests are reclaimed otherwise.

Everything else is :class:`~redcrawl.frontier.core.FrontierCore`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import msgpack

from redcrawl.codec import Envelope
from redcrawl.frontier.core import FrontierCore, Held
from redcrawl.frontier.records import (
    from_record,
    holds_under,
    parse_record,
    record,
    record_key,
    stored_int,
    stored_layout,
)
from redcrawl.frontier.settle import PendingSettle

__all__ = [
    "ListsFrontier",
    "PendingSettle",
    "from_record",
    "parse_record",
    "record",
    "stored_layout",
]


log = logging.getLogger(__name__)

_COUNTED = ("accepted", "filtered", "done", "retried", "reclaimed", "requeued", "inflight")
"""The stored counters :meth:`FrontierCore.counts` reads (in flight is one of them here)."""


class ListsFrontier(FrontierCore):
    """A crawl frontier on Redis lists and sorted sets (``REDCRAWL_BACKEND=lists``, the
    default). See :class:`~redcrawl.frontier.core.FrontierCore` for its operations."""

    BACKEND = "lists"
    STANDALONE = {"counts": ("frontier/lua/counts_lists.lua",)}

    def _script_keys(self) -> list[str]:
        return self.keys.script_keys(polite=self.politeness is not None)

    def _layout(self) -> str:
        if self.politeness is not None:
            return f"{self.settings.ordering}/{self.politeness}"
        return self.settings.ordering

    def _politeness_mode(self) -> str | None:
        return self._stored_politeness_mode(self.settings.ordering)

    def _push_extra(self, envelopes: Sequence[Envelope]) -> None:
        return None  # PUSH_STRIDE 3: nothing after (record, fingerprint, priority)

    def _count_states(self) -> tuple[Sequence[Any], int, int, int]:
        """The ``counts`` script, not a MULTI: a Redis out of memory refuses every
        command queued in a MULTI, reads too, and the counts are wanted then."""
        k = self.keys
        res = self._scripts.run("counts", *self._count_call())
        ready, delayed, dead = res[7], int(res[8]), int(res[9])
        if self.politeness is None:
            return res[:7], int(ready), delayed, dead
        queued = stored_int(ready)
        if queued is None:  # corrupt: recounted by any script, e.g. repair
            self.repair()
            queued = stored_int(self.client.hget(k.stats, "ready"))
        return res[:7], max(queued or 0, 0), delayed, dead

    def _count_call(self) -> tuple[list[str], list[Any]]:
        k = self.keys
        if self.politeness is not None:
            return [k.stats, k.delayed, k.dead], ["polite"]
        tiers = [k.ready(t) for t in range(k.tiers)]
        return [k.stats, k.delayed, k.dead, *tiers], [
            "zset" if self.settings.ordering == "priority" else "list"
        ]

    def _ready_ids(self, limit: int) -> Iterator[tuple[int, list[bytes]]]:
        if self.politeness is not None:
            yield from self._pol_ready_ids(limit, self.settings.ordering)
            return
        for t in range(self.keys.tiers):
            key = self.keys.ready(t)
            if self.settings.ordering == "priority":
                yield t, self.client.zrange(key, 0, limit - 1)
            elif self.settings.ordering == "fifo":
                yield t, self.client.lrange(key, -limit, -1)[::-1]
            else:
                yield t, self.client.lrange(key, 0, limit - 1)

    def _held(self, limit: int) -> Iterator[list[Held]]:
        """Lease by lease, soonest deadline first."""
        out = self._lease_state_out()
        for token, deadline in self.client.zrange(self.keys.inflight, 0, -1, withscores=True):
            lease = _lease_record(self.client.hget(self.keys.leases, token))
            if lease is None:
                continue  # gone, or corrupt (reclaimed when it expires)
            since, worker, ids = lease
            holds = partial(holds_under, token=token.decode(), out=out)
            yield [Held(rid, worker, since / 1000, deadline / 1000, holds, out) for rid in ids]

    def _in_flight_as(self, rid: bytes, field: str) -> tuple[bool, str | None, int]:
        if not self._lease_state_out():
            return super()._in_flight_as(rid, field)
        # (the record names no lease: the leases that list it say; one whose entry is
        # unreadable lists nothing, but the request is then in no ready queue)
        for batch in self._held(0):
            for h in batch:
                if h.id == rid and h.holds(field):
                    return True, h.worker, 1
        held = not self._in_ready(rid)
        return held, None, int(held)

    def _in_ready(self, rid: bytes) -> bool:
        """Whether ``rid`` is in a ready queue (with politeness: its key's queue of a tier)."""
        pkey = None
        if self.politeness is not None:
            pkey = record_key(self.client.hget(self.keys.req, rid) or b"")
        for t in range(self.keys.tiers):
            key = self.keys.ready(t)
            if pkey is not None:
                key = f"{self.keys.pol_queue_base}{t}:{pkey}"
            if self.settings.ordering == "priority":
                if self.client.zscore(key, rid) is not None:
                    return True
            elif self.client.lpos(key, rid) is not None:
                return True
        return False

    def _holder(self, token: str) -> str | None:
        lease = _lease_record(self.client.hget(self.keys.leases, token))
        return lease[1] if lease else None

    def _extra_keys(self) -> list[str]:
        return []  # the ready tiers and open zsets are in all_keys

    def _purge_extra(self) -> None:
        self._purge_politeness()

    def _forget_consumers(self, worker: str) -> None:
        pass  # a worker's leases are its only trace, and they are given back already


def _lease_record(raw: bytes | None) -> tuple[int, str, list[bytes]] | None:
    """(since ms, worker, ids) of a stored lease record; None if missing or corrupt."""
    if raw is None:
        return None
    try:
        since, worker, *ids = msgpack.unpackb(raw, raw=True)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    if not (
        isinstance(since, int)
        and isinstance(worker, bytes)
        and all(isinstance(i, bytes) for i in ids)
    ):
        return None
    return since, worker.decode(errors="replace"), ids
