"""The frontier interface every backend implements, and the records it returns.

A request is in exactly one state — READY, DELAYED, IN-FLIGHT, DONE or DEAD — and every
change of state is one atomic Redis step. The conservation law holds at every moment::

    accepted == ready + delayed + in_flight + done + dead
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from redcrawl.codec import Envelope

__all__ = [
    "Counts",
    "DeadInfo",
    "Frontier",
    "InflightInfo",
    "Lease",
    "PendingInfo",
    "PushResult",
    "RequestInfo",
    "SettleCall",
    "Settled",
    "fair_schedule",
    "format_id",
    "parse_id",
]


def format_id(raw: bytes) -> str:
    """Printable request id: a fingerprint id as 40 hex digits, else ``#<seq>``."""
    return raw.hex() if len(raw) == 20 else raw.decode("ascii", "replace")


def parse_id(text: str) -> bytes:
    """Inverse of :func:`format_id`."""
    if len(text) == 40:
        try:
            return bytes.fromhex(text)
        except ValueError:
            pass
    return text.encode()


@dataclass(frozen=True, slots=True)
class Lease:
    """A request handed to a worker. Ack or nack it with this object."""

    id: bytes
    """The request's id: its fingerprint, or ``#<seq>`` for a request without one."""
    token: str
    """Unique in the crawl; acks and nacks with a stale token are ignored."""
    worker: str
    attempts: int
    """How many times the request has been delivered, this time included."""
    envelope: Envelope


@dataclass(frozen=True, slots=True)
class PushResult:
    accepted: int
    filtered: int
    flags: tuple[bool, ...]
    """One per pushed envelope: True if accepted, False if it was a duplicate."""


@dataclass(frozen=True, slots=True)
class Settled:
    """What one :meth:`Frontier.settle` round trip did."""

    pushed: PushResult
    acked: int
    leases: list[Lease]
    unacked: tuple[Lease, ...] = ()
    """Acks this call refused because a settle begun before it was refused by Redis (its
    children may not be stored): still IN-FLIGHT. Ack them again (:meth:`Frontier.ack`
    or a later settle) once what the refused settle carried is stored; see
    :meth:`Frontier.settle_begin`."""


@dataclass(frozen=True, slots=True)
class Counts:
    """The terms of the conservation law, plus event counters."""

    accepted: int
    filtered: int
    ready: int
    delayed: int
    in_flight: int
    done: int
    dead: int
    retried: int = 0
    reclaimed: int = 0
    requeued: int = 0

    @property
    def pending(self) -> int:
        """Requests that may still be processed: ready + delayed + in flight."""
        return self.ready + self.delayed + self.in_flight

    @property
    def finished(self) -> bool:
        """True when nothing is ready, delayed or in flight anywhere in the crawl."""
        return self.pending == 0

    @property
    def conserved(self) -> bool:
        return self.accepted == self.ready + self.delayed + self.in_flight + self.done + self.dead


@dataclass(frozen=True, slots=True)
class PendingInfo:
    id: str
    tier: int
    url: str
    priority: int


@dataclass(frozen=True, slots=True)
class InflightInfo:
    id: str
    worker: str
    attempts: int
    since: float
    """When it was leased (seconds since the epoch, server clock)."""
    deadline: float
    url: str


@dataclass(frozen=True, slots=True)
class DeadInfo:
    id: str
    died_at: float
    error: str
    attempts: int
    url: str


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """One stored request, wherever it is (see :meth:`Frontier.describe`)."""

    id: str
    state: str
    """"ready", "delayed", "in_flight" or "dead"."""
    attempts: int
    envelope: Envelope | None
    """None if the stored envelope cannot be decoded."""
    worker: str | None = None
    """The worker holding it (in flight)."""
    due: float | None = None
    """When it becomes ready (delayed), seconds since the epoch."""
    error: str | None = None
    """Its last error (retried or dead)."""


class SettleCall(Protocol):
    """A settle round trip on its way (:meth:`Frontier.settle_begin`)."""

    def result(self) -> Settled: ...


@runtime_checkable
class Frontier(Protocol):
    """The operations of a crawl frontier. See :class:`redcrawl.frontier.ListsFrontier`."""

    def push(self, envelopes: Sequence[Envelope], *, delay: float = 0.0,
             recrawl: bool = False) -> PushResult: ...
    def lease(self, worker: str, n: int, ttl: float | None = None) -> list[Lease]: ...
    def ack(self, leases: Sequence[Lease]) -> int: ...
    def release(self, leases: Sequence[Lease]) -> int: ...
    def settle(self, push: Sequence[Envelope] = (), ack: Sequence[Lease] = (), *,
               lease: tuple[str, int] | None = None,
               ttl: float | None = None) -> Settled: ...
    def settle_begin(self, push: Sequence[Envelope] = (), ack: Sequence[Lease] = (), *,
                     lease: tuple[str, int] | None = None,
                     ttl: float | None = None) -> SettleCall: ...
    def nack(self, lease: Lease, error: str, *, retry: bool = True,
             delay: float | None = None) -> str: ...
    def renew(self, worker: str, ttl: float | None = None) -> None: ...
    def release_worker(self, worker: str) -> int: ...
    def maintain(self) -> tuple[int, int]: ...
    def counts(self) -> Counts: ...
    def pending(self, limit: int = 100) -> list[PendingInfo]: ...
    def inflight(self, limit: int = 100) -> list[InflightInfo]: ...
    def dead(self, limit: int = 100) -> list[DeadInfo]: ...
    def describe(self, id: str) -> RequestInfo | None: ...
    def requeue_dead(self, ids: Sequence[str] | None = None, *, limit: int = 1000) -> int: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def is_paused(self) -> bool: ...
    def workers(self) -> dict[str, float]: ...
    def purge(self) -> None: ...


def fair_schedule(weights: Sequence[int]) -> str:
    """Smooth weighted round robin over tiers: one hex digit per slot.

    ``fair_schedule([5, 3, 2]) == "0102010201"``-like: each tier appears ``weight`` times
    in ``sum(weights)`` slots, spread out, so that low tiers are served steadily.
    """
    current = [0] * len(weights)
    total = sum(weights)
    out = []
    for _ in range(total):
        for i, w in enumerate(weights):
            current[i] += w
        best = max(range(len(weights)), key=lambda i: current[i])
        current[best] -= total
        out.append(format(best, "x"))
    return "".join(out)
