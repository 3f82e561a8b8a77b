"""Idempotent item storage: every item is upserted under a unique key.

:class:`UpsertPipeline` writes each scraped item, as JSON, into one table keyed by a field
of the item (``REDCRAWL_ITEM_KEY``, default ``url``). Writing the same key again replaces
the stored item and bumps its ``version``, so when a worker dies and its requests are
fetched again, the re-scraped items overwrite their earlier copies instead of adding
duplicates.

Settings (read from ``crawler.settings``):

``REDCRAWL_ITEMS_URI``
    Where items go. ``sqlite:///relative/path.db`` (relative to the working directory),
    ``sqlite:////absolute/path.db`` or ``postgresql://user:pass@host:port/db`` (needs
    psycopg 3: ``pip install "redcrawl[postgres]"``). Default ``sqlite:///items.db``.
``REDCRAWL_ITEMS_TABLE``
    Table name, an SQL identifier (letters, digits, underscores; not starting with a
    digit). Created if missing. Default ``items``.
``REDCRAWL_ITEM_KEY``
    The item field whose value identifies the item. Default ``url``.

The table::

    key         TEXT PRIMARY KEY    the key field's value (an integer key is stored as text)
    item        JSON                the whole item (JSONB on PostgreSQL, TEXT on SQLite)
    spider      TEXT                name of the spider that last wrote it
    first_seen  timestamp           first write (TIMESTAMPTZ; ISO-8601 UTC text on SQLite)
    updated_at  timestamp           last write
    version     INTEGER             1 on the first write, +1 on every rewrite

Usage::

    ITEM_PIPELINES = {"redcrawl.scrapy.pipelines.UpsertPipeline": 300}
    REDCRAWL_ITEMS_URI = "sqlite:///out/items.db"
    REDCRAWL_ITEM_KEY = "url"

:func:`read_items` reads a table back as ``{key: item}``. The sinks (SQLite, PostgreSQL)
are in :mod:`redcrawl.scrapy.sinks`; this module holds the Scrapy pipeline.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, NoReturn

from itemadapter import ItemAdapter
from scrapy.exceptions import DropItem

from redcrawl.errors import ConfigError
from redcrawl.scrapy.counters import counters_of
from redcrawl.scrapy.lifecycle import refusing_config_errors
from redcrawl.scrapy.sinks import PostgresSink as PostgresSink
from redcrawl.scrapy.sinks import RejectedItem, Sink, read_items, sink_from_uri
from redcrawl.scrapy.sinks import SQLiteSink as SQLiteSink
from redcrawl.scrapy.sinks.common import DEFAULT_ITEM_KEY as DEFAULT_ITEM_KEY
from redcrawl.scrapy.sinks.common import DEFAULT_ITEMS_TABLE as DEFAULT_ITEMS_TABLE
from redcrawl.scrapy.sinks.common import DEFAULT_ITEMS_URI as DEFAULT_ITEMS_URI
from redcrawl.settings import Settings

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

__all__ = [
    "DEFAULT_ITEMS_TABLE",
    "DEFAULT_ITEMS_URI",
    "DEFAULT_ITEM_KEY",
    "PostgresSink",
    "RejectedItem",
    "SQLiteSink",
    "Sink",
    "UpsertPipeline",
    "read_items",
    "sink_from_uri",
]

logger = logging.getLogger(__name__)


STAT_WRITTEN = "redcrawl/items_written"
STAT_DROPPED = "redcrawl/items_dropped"
STAT_INSERTED = "redcrawl/items_inserted"
STAT_UPDATED = "redcrawl/items_updated"


# --- the pipeline -------------------------------------------------------------------------


class UpsertPipeline:
    """Scrapy item pipeline that upserts every item under its key field.

    Durability: **one commit per item**. :meth:`process_item` returns only after the
    item's row is committed, because redcrawl's frontier acknowledges a request once the
    item pipeline is done with its items; an item acknowledged but still sitting in an
    unflushed batch would be lost if the worker were SIGKILLed. Hence at-least-once: an
    item is either committed before its request is acked, or the request is fetched
    again and the upsert rewrites the same row (``version`` goes up, no duplicate row).
    Batching is deliberately not done: on SQLite in WAL mode with ``synchronous=NORMAL``
    a commit is a write to the WAL file without an fsync (well under a millisecond), and on
    PostgreSQL it is one round trip, cheap next to fetching a page.

    Items of any kind :class:`itemadapter.ItemAdapter` supports (dicts, ``scrapy.Item``,
    dataclasses, attrs classes) are stored whole as JSON. An item whose key field is
    missing, empty or not a string/integer, or that holds a value JSON cannot represent
    (bytes, datetimes, sets, NaN…), is dropped with :class:`~scrapy.exceptions.DropItem`
    naming the field; the crawl goes on. Stats: ``redcrawl/items_written`` (split into
    ``redcrawl/items_inserted`` and ``redcrawl/items_updated``: a key stored before, i.e.
    a duplicate item), ``redcrawl/items_dropped``. Under redcrawl's scheduler the
    inserted/updated counts also go to the crawl in Redis with the worker's heartbeats
    (``redcrawl_items_stored_total`` in docs/metrics.md).
    """

    def __init__(
        self,
        sink: Sink,
        *,
        key_field: str = DEFAULT_ITEM_KEY,
        stats: StatsCollector | None = None,
        crawler: Crawler | None = None,
    ) -> None:
        if not isinstance(key_field, str) or not key_field:
            raise ConfigError(
                "REDCRAWL_ITEM_KEY", f"{key_field!r}: give the name of an item field, e.g. 'url'"
            )
        self.sink = sink
        self.key_field = key_field
        self.stats = stats
        self.crawler = crawler
        self._spider_name: str | None = None
        self._told_missing = False  # the ERROR for items without the key field said

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> UpsertPipeline:
        with refusing_config_errors(crawler):
            settings = Settings.from_scrapy(crawler.settings)
            return cls(
                sink_from_uri(settings.items_uri, settings.items_table),
                key_field=settings.item_key,
                stats=crawler.stats,
                crawler=crawler,
            )

    # Recent Scrapy (2.19 here) calls these without the spider (a required spider argument is
    # deprecated there); older versions pass it.
    def open_spider(self, spider: Spider | None = None) -> None:
        self._spider_name = self._name_of(spider)
        self.sink.open()
        logger.info("UpsertPipeline: writing items to %r keyed by %r", self.sink, self.key_field)

    def close_spider(self, spider: Spider | None = None) -> None:
        self.sink.close()

    def process_item(self, item: Any, spider: Spider | None = None) -> Any:
        try:
            adapter = ItemAdapter(item)
        except TypeError:
            self._dropped(
                f"{type(item).__name__} is not an item type (dict, scrapy.Item, "
                "dataclass or attrs class)"
            )
        key = self._key(adapter)
        text = self._encode(adapter)
        name = self._name_of(spider) if spider is not None else self._spider_name
        try:
            inserted = self.sink.upsert(key, text, name)
        except RejectedItem as exc:
            self._dropped(f"item {self.key_field}={key!r} not stored: {exc}")
        if self.stats is not None:
            self.stats.inc_value(STAT_WRITTEN)
            self.stats.inc_value(STAT_INSERTED if inserted else STAT_UPDATED)
        counters = counters_of(self.crawler)
        if counters is not None:
            counters.stored(bool(inserted))
        return item

    # --- helpers ---------------------------------------------------------------------
    def _name_of(self, spider: Spider | None) -> str | None:
        if spider is not None:
            return str(spider.name)
        if self.crawler is not None:
            if self.crawler.spider is not None:
                return str(self.crawler.spider.name)
            return getattr(self.crawler.spidercls, "name", None)
        return None

    def _dropped(self, message: str) -> NoReturn:
        if self.stats is not None:
            self.stats.inc_value(STAT_DROPPED)
        raise DropItem(message)

    def _key(self, adapter: ItemAdapter) -> str:
        field = self.key_field
        value = adapter.get(field)
        if value is None or (isinstance(value, str) and not value.strip()):
            state = (
                "is missing" if field not in adapter else "is None" if value is None else "is empty"
            )
            if state == "is missing" and not self._told_missing:
                self._told_missing = True
                logger.error(
                    "UpsertPipeline: an item has no field %r (REDCRAWL_ITEM_KEY), so it is "
                    "dropped, as is every item without it; its fields are %s: set "
                    "REDCRAWL_ITEM_KEY to the one that identifies an item",
                    field,
                    sorted(adapter.field_names()),
                )
            self._dropped(
                f"key field {field!r} (REDCRAWL_ITEM_KEY) {state}; cannot store the item without it"
            )
        if isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return self._dropped(
            f"key field {field!r} (REDCRAWL_ITEM_KEY) is a "
            f"{type(value).__name__}; it must be a string or an integer"
        )

    def _encode(self, adapter: ItemAdapter) -> str:
        data = adapter.asdict()
        try:
            return _dumps(data)
        except (TypeError, ValueError, RecursionError) as whole:
            for name, value in data.items():
                try:
                    _dumps({name: value})
                except (TypeError, ValueError, RecursionError) as exc:
                    return self._dropped(
                        f"field {name!r} is not JSON-serialisable ({type(exc).__name__}: {exc})"
                    )
            return self._dropped(f"item is not JSON-serialisable ({whole})")


def _dumps(data: Any) -> str:
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    text.encode("utf-8")  # lone surrogates cannot be stored: UnicodeEncodeError (ValueError)
    return text
