"""The frontiers of the crawls a long-running reader serves (the HTTP API, the metrics
snapshot), each opened once with the layout its crawl was created with
(``open_frontier(..., follow_layout=True)``) and kept, and opened again when the crawl's
stored layout is not the one it was opened with: a crawl purged elsewhere (``redcrawl
purge``, another API process, a ``SCHEDULER_PERSIST = False`` crawl removing itself) and
created again with another backend, ordering or dedupe was read with the old one (trial
16: in flight 0 while 2 were leased, a streams crawl's shards refused as "lists")."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from redcrawl.frontier import FrontierCore, open_frontier
from redcrawl.keys import CrawlKeys
from redcrawl.settings import Settings
from redcrawl.transport import redis_errors

__all__ = ["OpenFrontiers"]

Layout = tuple[Any, ...]
"""The crawl's stored layout fields (``layout``, ``layout.copy``) as read."""


class OpenFrontiers:
    """At most ``size`` frontiers, the least recently used dropped first. Each
    :meth:`get` reads the crawl's layout fields (one ``HMGET``), or takes them from the
    caller (:meth:`layouts`: many crawls in one pipelined round)."""

    def __init__(self, client: Callable[[], Any], settings: Settings, size: int) -> None:
        self._client = client
        self.settings = settings
        self.size = size
        self._open: OrderedDict[str, tuple[FrontierCore, Layout]] = OrderedDict()
        self._lock = threading.Lock()

    def _control(self, crawl: str) -> str:
        return CrawlKeys(crawl, prefix=self.settings.key_prefix, tiers=self.settings.tiers).control

    def layouts(self, crawls: Sequence[str]) -> list[Layout]:
        """The stored layout fields of each crawl, in one pipelined round."""
        with redis_errors("reading the crawl layout"):
            pipe = self._client().pipeline(transaction=False)
            for crawl in crawls:
                pipe.hmget(self._control(crawl), "layout", "layout.copy")
            replies = pipe.execute(raise_on_error=False)
        # (a reply that is an error, e.g. a control key of the wrong type: never equal to
        # a kept frontier's, so the crawl is opened again, which says what is wrong)
        return [tuple(r) if isinstance(r, list) else (r,) for r in replies]

    def get(self, crawl: str, layout: Layout | None = None) -> FrontierCore:
        """The crawl's frontier: the one kept if its crawl's layout is unchanged, else
        opened (again) now."""
        if layout is None:
            (layout,) = self.layouts([crawl])
        with self._lock:
            kept = self._open.get(crawl)
            if kept is not None and kept[1] == layout:
                self._open.move_to_end(crawl)
                return kept[0]
        f = open_frontier(self._client(), self.settings, crawl, follow_layout=True)
        with self._lock:
            self._open[crawl] = (f, layout)
            self._open.move_to_end(crawl)
            while len(self._open) > self.size:
                self._open.popitem(last=False)
        return f

    def clear(self) -> None:
        with self._lock:
            self._open.clear()
