"""The records the frontier returns, and the helpers every backend shares. The interface
itself is :class:`redcrawl.frontier.core.FrontierCore` (exported as ``Frontier``).

A request is in exactly one state — READY, DELAYED, IN-FLIGHT, DONE or DEAD — and every
change of state is one atomic Redis step. The conservation law holds at every moment::

    accepted == ready + delayed + in_flight + done + dead
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from redcrawl.codec import Envelope

__all__ = [
    "Counts",
    "DeadInfo",
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


@dataclass(frozen=True, slots=True, init=False)
class Lease:
    """A request handed to a worker. Ack or nack it with this object.

    Immutable, compared (without ``received`` and ``granted``), printed and copied with
    :func:`dataclasses.replace` as a frozen dataclass; only its constructor is written
    out: one is built per leased request, and the generated one of a frozen dataclass
    sets each field through ``object.__setattr__`` (about 0.7 µs against 0.4 µs here).
    """

    id: bytes
    """The request's id: its fingerprint, or ``#<seq>`` for a request without one."""
    token: str
    """Unique in the crawl; acks and nacks with a stale token are ignored."""
    worker: str
    attempts: int
    """How many times the request has been delivered, this time included."""
    envelope: Envelope
    received: float = field(default=0.0, compare=False)
    """When the lease reply reached this process (``time.monotonic()``; 0 if unknown): a
    worker with fleet-wide politeness does not start a request that waited here past its
    start window (``REDCRAWL_POLITENESS_START_WINDOW``), since its delay was charged when
    it was granted."""
    granted: float = field(default=0.0, compare=False)
    """When Redis granted it, at the earliest, on this process's ``time.monotonic()``
    clock (0 if unknown): the Redis time of the grant, carried by the lease reply, plus a
    lower bound of this process's clock offset to Redis (``FrontierCore`` keeps one per
    Redis node from the send times of its calls), and never before the call was sent. A
    reply that sat in a socket or behind the GIL leaves ``received`` late but not this:
    a worker measures a request's wait against its start window from here
    (docs/politeness.md, "Start window")."""

    def __init__(
        self,
        id: bytes,
        token: str,
        worker: str,
        attempts: int,
        envelope: Envelope,
        received: float = 0.0,
        granted: float = 0.0,
    ) -> None:
        # the slots' own setters: what object.__setattr__ ends in, without its lookups
        _set_id(self, id)
        _set_token(self, token)
        _set_worker(self, worker)
        _set_attempts(self, attempts)
        _set_envelope(self, envelope)
        _set_received(self, received)
        _set_granted(self, granted)


_set_id, _set_token, _set_worker, _set_attempts, _set_envelope, _set_received, _set_granted = (
    Lease.__dict__[name].__set__
    for name in ("id", "token", "worker", "attempts", "envelope", "received", "granted")
)


@dataclass(frozen=True, slots=True)
class PushResult:
    accepted: int
    filtered: int
    flags: tuple[bool, ...]
    """One per pushed envelope: True if accepted, False if it was a duplicate."""


@dataclass(frozen=True, slots=True)
class Settled:
    """What one :meth:`~redcrawl.frontier.core.FrontierCore.settle` round trip did."""

    pushed: PushResult
    acked: int
    leases: list[Lease]
    unacked: tuple[Lease, ...] = ()
    """Acks this call refused because a settle begun before it was refused by Redis (its
    children may not be stored): still IN-FLIGHT. Ack them again
    (:meth:`~redcrawl.frontier.core.FrontierCore.ack` or a later settle) once what the
    refused settle carried is stored; see
    :meth:`~redcrawl.frontier.core.FrontierCore.settle_begin`."""


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
    """One stored request, wherever it is (see
    :meth:`~redcrawl.frontier.core.FrontierCore.describe`)."""

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
    """A settle round trip on its way
    (:meth:`~redcrawl.frontier.core.FrontierCore.settle_begin`)."""

    def result(self) -> Settled: ...


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
