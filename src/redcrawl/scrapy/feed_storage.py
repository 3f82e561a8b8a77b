"""A local feed file that gets each item before its request is acknowledged.

Scrapy writes a feed through a file buffer flushed when the spider closes; redcrawl
acknowledges a request once its items are through the pipelines and exported
(``item_scraped``), so a worker SIGKILLed with items in that buffer lost them for good:
their requests were done. :class:`FlushedFileFeedStorage` flushes the file to the
operating system after each write (one ``write`` call per JSON-lines or CSV item, a few
per XML item), so an item is
in the file before its request is done; a request fetched again after a kill may write
its item twice, never none. A power cut can still lose what the kernel had not written.

Used for local files (``""`` and ``file``) by ``redcrawl crawl`` (its ``-o`` and a project's
``FEEDS``), the add-on (:data:`FEED_STORAGES_BASE`) and the scheduler at start
(:func:`flush_local_feeds`); a project's own ``FEED_STORAGES`` entries win.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import IO, Any

from scrapy.extensions.feedexport import FileFeedStorage
from scrapy.settings import default_settings

__all__ = ["FEED_STORAGES_BASE", "FlushedFileFeedStorage", "flush_local_feeds"]


class _FlushedWriter(io.BufferedWriter):
    def write(self, data: Any) -> int:
        n = super().write(data)
        self.flush()
        return n


class FlushedFileFeedStorage(FileFeedStorage):
    """Scrapy's local file storage, flushed after each write."""

    def open(self, spider: Any) -> IO[bytes]:
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)  # (N workers may race to make it)
        return _FlushedWriter(io.FileIO(path, self.write_mode))


_PATH = f"{FlushedFileFeedStorage.__module__}.{FlushedFileFeedStorage.__qualname__}"

FEED_STORAGES_BASE: dict[str, str] = {
    **default_settings.FEED_STORAGES_BASE,
    "": _PATH,
    "file": _PATH,
}
"""Scrapy's ``FEED_STORAGES_BASE`` with local files flushed after each write."""


def flush_local_feeds(crawler: Any) -> list[str]:
    """Make the crawler's feed exporter write local files with
    :class:`FlushedFileFeedStorage` (the scheduler calls this at start: a project that
    sets ``SCHEDULER`` by hand, without the add-on or ``redcrawl crawl``, lost a killed
    worker's buffered feed items). Only where the storage is still Scrapy's own
    ``FileFeedStorage``: a project's own storage wins. Returns the URI schemes changed."""
    from scrapy.extensions.feedexport import FeedExporter

    changed = []
    for ext in getattr(getattr(crawler, "extensions", None), "middlewares", ()):
        if isinstance(ext, FeedExporter):
            for scheme in ("", "file"):
                if ext.storages.get(scheme) is FileFeedStorage:
                    ext.storages[scheme] = FlushedFileFeedStorage
                    changed.append(scheme)
    return changed
