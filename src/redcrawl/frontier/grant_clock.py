"""When a lease was granted, on this process's clock (docs/politeness.md, "Start window").

A lease reply carries the Redis time of its grant (the script's clock in whole
milliseconds: what the key's delay was charged from). To compare it with this process's
``time.monotonic()`` a worker needs the offset between the two clocks. It cannot know it
exactly, but every call bounds it from both sides: the call ran after it was sent and
before its reply was read, so ``sent - server <= offset <= received - server``. The
largest lower bound seen is tight to within the fastest call's send-to-run time (under a
millisecond on a quiet connection), whatever the later calls' transit: a reply that sat
in a socket or behind the GIL for 60 ms moves ``received``, not the grant time computed
here. The grant time is therefore a lower bound: a request measured from it is never
judged on time when it is late.

Kept per frontier (one Redis node: a partition's master on a cluster; another node's
clock is another offset). The bound decays by :data:`DRIFT` per second (the two clocks
may run at slightly different rates) and starts afresh when a call shows it too high (the
server's clock stepped forward, or a failover moved the crawl to a node with another
clock).
"""

from __future__ import annotations

__all__ = ["DRIFT", "GrantClock"]

DRIFT = 5e-4
"""Seconds per second the lower bound of the offset decays: the most two clocks may drift
apart under NTP's slewing (500 ppm), so the bound stays a bound between fast calls."""

SERVER_TICK = 0.001
"""The server's clock as the scripts read it: milliseconds, rounded down."""


class GrantClock:
    """A lower bound of (this process's monotonic clock - the Redis server's clock)."""

    __slots__ = ("_at", "_low")

    def __init__(self) -> None:
        self._low: float | None = None
        self._at = 0.0

    @property
    def offset(self) -> float | None:
        """The current lower bound of the offset, seconds (None: no call seen yet)."""
        return self._low

    def granted(self, sent: float, server_ms: float | None, received: float) -> float:
        """The earliest time (``time.monotonic()``) at which a call sent at ``sent``, run
        at ``server_ms`` by the server's clock (None: unknown, e.g. a replayed call) and
        answered at ``received`` made its grants. Never before ``sent``; 0.0 if ``sent``
        is unknown (0) and no bound is known either."""
        if server_ms is None:
            return sent
        server = float(server_ms) / 1000
        low = sent - server - SERVER_TICK if sent else None
        high = received - server
        bound = self._low
        if bound is not None:
            bound -= DRIFT * max(received - self._at, 0.0)
            if bound > high:  # it cannot be above the true offset: the server's clock moved
                bound = None
        if low is not None and (bound is None or low > bound):
            bound = low
        if bound is None:
            return sent
        self._low, self._at = bound, received
        return max(server + bound, sent)
