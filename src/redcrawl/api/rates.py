"""Rates of a crawl from counter samples kept in this process's memory.

Every time the API reads a crawl's counts it records ``(time, done, accepted)``; a rate is
the change between the oldest and newest sample of the last minute. The samples belong to
one API process: two API processes behind a load balancer each compute their own rates.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from redcrawl.api.models import Rates

__all__ = ["RateBook"]

WINDOW = 60.0
"""Seconds of samples kept per crawl."""
MIN_SPAN = 1.0
"""Samples must span at least this long before a rate is reported."""
MAX_SAMPLES = 600
MAX_CRAWLS = 10_000


class RateBook:
    """Samples of ``done`` and ``accepted`` per crawl; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._samples: dict[str, deque[tuple[float, int, int]]] = {}
        self._lock = threading.Lock()

    def observe(self, crawl: str, done: int, accepted: int) -> Rates:
        """Record a sample and return the rates over the last minute."""
        now = self._clock()
        with self._lock:
            samples = self._samples.pop(crawl, None)
            if samples is None:
                samples = deque(maxlen=MAX_SAMPLES)
            elif samples and (done < samples[-1][1] or accepted < samples[-1][2]):
                samples.clear()  # counters went down: the crawl was purged
            while samples and samples[0][0] < now - WINDOW:
                samples.popleft()
            samples.append((now, done, accepted))
            self._samples[crawl] = samples  # most recently observed last
            while len(self._samples) > MAX_CRAWLS:
                del self._samples[next(iter(self._samples))]
            t0, done0, accepted0 = samples[0]
        span = now - t0
        if span < MIN_SPAN:
            return Rates(window=None, done_per_s=None, accepted_per_s=None)
        return Rates(
            window=round(span, 3),
            done_per_s=(done - done0) / span,
            accepted_per_s=(accepted - accepted0) / span,
        )
