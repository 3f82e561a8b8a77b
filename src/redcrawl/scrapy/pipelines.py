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

:func:`read_items` reads a table back as ``{key: item}``.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from itemadapter import ItemAdapter
from scrapy.exceptions import DropItem

from redcrawl.errors import ConfigError
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

DEFAULT_ITEMS_URI = Settings().items_uri
DEFAULT_ITEMS_TABLE = Settings().items_table
DEFAULT_ITEM_KEY = Settings().item_key

STAT_WRITTEN = "redcrawl/items_written"
STAT_DROPPED = "redcrawl/items_dropped"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_MAX_IDENTIFIER = 63  # PostgreSQL's limit; longer names would be silently truncated there
_COLUMNS = ("key", "item", "spider", "first_seen", "updated_at", "version")
_PG_INSTALL_HINT = 'pip install "redcrawl[postgres]"'


class RejectedItem(ValueError):
    """The database refused this one item (e.g. PostgreSQL and a NUL character in text).

    Raised by a sink's ``upsert``; nothing was written and the connection is still usable.
    :class:`UpsertPipeline` turns it into :class:`~scrapy.exceptions.DropItem`.
    """


class Sink(Protocol):
    """Where :class:`UpsertPipeline` writes. ``upsert`` returns only once the row is committed."""

    def open(self) -> None:
        """Connect, and create the table if it is missing."""

    def upsert(self, key: str, item_json: str, spider: str | None) -> None:
        """Insert or replace the item stored under ``key``; committed when this returns."""

    def close(self) -> None:
        """Release the connection. Safe to call twice."""


def _check_table(table: object) -> str:
    if not isinstance(table, str) or not _IDENTIFIER.match(table):
        raise ConfigError(
            "REDCRAWL_ITEMS_TABLE",
            f"{table!r} is not a valid table name: use letters, digits and underscores, "
            "not starting with a digit (e.g. 'items')",
        )
    if len(table) > _MAX_IDENTIFIER:
        raise ConfigError(
            "REDCRAWL_ITEMS_TABLE",
            f"{table!r} is {len(table)} characters long; use at most {_MAX_IDENTIFIER}",
        )
    return table


def _quote(identifier: str) -> str:
    # Validated by _check_table, so it holds no quote; quoting lets reserved words
    # ("order", "user") work as table names.
    return f'"{identifier}"'


def _redact(uri: str) -> str:
    """The URI without its password, for messages and logs."""
    return re.sub(r"(://[^:/?#@]*:)[^@/?#]*@", r"\1***@", uri)


# --- SQLite -------------------------------------------------------------------------------

_SQLITE_NOW = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"


class SQLiteSink:
    """Items in an SQLite file, shared safely by several worker processes.

    The database is put in WAL mode (readers never block the writer) with
    ``synchronous=NORMAL``: a committed row is in the WAL file before ``upsert`` returns,
    so it survives the writing process being killed; only an operating-system crash or
    power loss can lose the last commits (pass ``synchronous="FULL"`` to fsync every
    commit). Writers from other processes queue on SQLite's lock for up to ``timeout``
    seconds (``busy_timeout``) instead of failing with "database is locked".
    """

    def __init__(self, path: str | Path, table: str = DEFAULT_ITEMS_TABLE, *,
                 timeout: float = 60.0, synchronous: str = "NORMAL") -> None:
        self.path = Path(path)
        self.table = _check_table(table)
        if synchronous.upper() not in ("NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous={synchronous!r}: use NORMAL, FULL or EXTRA")
        self.synchronous = synchronous.upper()
        self.timeout = timeout
        self._conn: sqlite3.Connection | None = None
        t = _quote(self.table)
        self._upsert_sql = (
            f"INSERT INTO {t} (key, item, spider, first_seen, updated_at, version) "
            f"VALUES (?, ?, ?, {_SQLITE_NOW}, {_SQLITE_NOW}, 1) "
            "ON CONFLICT (key) DO UPDATE SET item = excluded.item, spider = excluded.spider, "
            f"updated_at = excluded.updated_at, version = {t}.version + 1"
        )

    def __repr__(self) -> str:
        return f"SQLiteSink({str(self.path)!r}, table={self.table!r})"

    def open(self) -> None:
        if self._conn is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        try:
            # Several processes may open a fresh file at once: switching to WAL and
            # creating the table take locks, which busy_timeout waits for. SQLite skips the
            # busy handler in a few corner cases (e.g. while another connection recovers
            # the WAL), so lock errors during set-up are retried until the timeout.
            deadline = time.monotonic() + self.timeout
            while True:
                try:
                    self._set_up(conn)
                    break
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) and "busy" not in str(exc):
                        raise
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _set_up(self, conn: sqlite3.Connection) -> None:
        conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            logger.warning("%s: SQLite refused WAL mode (journal_mode=%s)", self.path, mode)
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        t = _quote(self.table)
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {t} ("
            "key TEXT PRIMARY KEY NOT NULL, "
            "item TEXT NOT NULL, "  # JSON text
            "spider TEXT, "
            "first_seen TEXT NOT NULL, "
            "updated_at TEXT NOT NULL, "
            "version INTEGER NOT NULL DEFAULT 1)"
        )
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({t})")}
        _check_columns(self.table, columns)

    def upsert(self, key: str, item_json: str, spider: str | None) -> None:
        if self._conn is None:
            raise RuntimeError(f"{self!r} is not open")
        # Autocommit mode: the statement is its own transaction, committed on return.
        self._conn.execute(self._upsert_sql, (key, item_json, spider))

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every stored ``(key, item)``, by key; the table need not be open for writing."""
        if not self.path.exists():
            raise FileNotFoundError(f"no SQLite database at {self.path}")
        uri = self.path.resolve().as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=self.timeout)
        try:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (self.table,)
            ).fetchone()
            if found is None:
                return
            for key, text in conn.execute(
                f"SELECT key, item FROM {_quote(self.table)} ORDER BY key"
            ):
                yield key, json.loads(text)
        finally:
            conn.close()


def _check_columns(table: str, columns: set[str]) -> None:
    missing = [c for c in _COLUMNS if c not in columns]
    if missing:
        raise ConfigError(
            "REDCRAWL_ITEMS_TABLE",
            f"table {table!r} already exists but is not an items table (no column "
            f"{', '.join(missing)}); choose another table name",
        )


# --- PostgreSQL ---------------------------------------------------------------------------


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise ConfigError(
            "REDCRAWL_ITEMS_URI",
            "a postgresql:// URI needs psycopg 3, which is not installed: "
            f"{_PG_INSTALL_HINT} (or pip install \"psycopg[binary]\")",
        ) from exc
    return psycopg


class PostgresSink:
    """Items in a PostgreSQL table (``item`` is JSONB), via psycopg 3.

    The connection is in autocommit mode, so each upsert is its own transaction and is
    committed (with PostgreSQL's usual durability) when :meth:`upsert` returns. A lost
    connection is reopened once and the upsert retried; repeating it is harmless since
    an upsert is idempotent apart from the ``version`` counter.
    """

    def __init__(self, dsn: str, table: str = DEFAULT_ITEMS_TABLE, *,
                 connect_timeout: float = 10.0) -> None:
        self._pg = _psycopg()  # fail at construction (crawler start), not mid-crawl
        self.dsn = dsn
        self.table = _check_table(table)
        self.connect_timeout = connect_timeout
        self._conn: Any = None
        t = _quote(self.table)
        self._upsert_sql = (
            f"INSERT INTO {t} (key, item, spider) VALUES (%s, %s::jsonb, %s) "
            "ON CONFLICT (key) DO UPDATE SET item = excluded.item, spider = excluded.spider, "
            f"updated_at = now(), version = {t}.version + 1"
        )

    def __repr__(self) -> str:
        return f"PostgresSink({_redact(self.dsn)!r}, table={self.table!r})"

    def _connect(self) -> Any:
        return self._pg.connect(self.dsn, autocommit=True,
                                connect_timeout=max(1, round(self.connect_timeout)),
                                application_name="redcrawl")

    def open(self) -> None:
        if self._conn is not None:
            return
        conn = self._connect()
        try:
            t = _quote(self.table)
            with conn.transaction():
                # Concurrent CREATE TABLE IF NOT EXISTS can still collide in the catalog;
                # workers starting together take turns.
                lock = zlib.crc32(f"redcrawl.items:{self.table}".encode())
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {t} ("
                    "key TEXT PRIMARY KEY, "
                    "item JSONB NOT NULL, "
                    "spider TEXT, "
                    "first_seen TIMESTAMPTZ NOT NULL DEFAULT now(), "
                    "updated_at TIMESTAMPTZ NOT NULL DEFAULT now(), "
                    "version INTEGER NOT NULL DEFAULT 1)"
                )
            rows = conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name = %s",
                (self.table,),
            ).fetchall()
            _check_columns(self.table, {r[0] for r in rows})
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def upsert(self, key: str, item_json: str, spider: str | None) -> None:
        if self._conn is None:
            raise RuntimeError(f"{self!r} is not open")
        try:
            self._execute_upsert(key, item_json, spider)
        except self._pg.OperationalError:
            if not self._conn.closed:
                raise
            logger.warning("%r: connection lost; reconnecting and retrying once", self)
            self._conn = self._connect()
            self._execute_upsert(key, item_json, spider)

    def _execute_upsert(self, key: str, item_json: str, spider: str | None) -> None:
        try:
            self._conn.execute(self._upsert_sql, (key, item_json, spider))
        except self._pg.DataError as exc:
            raise RejectedItem(f"PostgreSQL refused the item: {exc}".strip()) from exc

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every stored ``(key, item)``, by key; nothing if the table does not exist."""
        with self._connect() as conn:
            exists = conn.execute("SELECT to_regclass(%s)", (_quote(self.table),)).fetchone()
            if exists is None or exists[0] is None:
                return
            yield from conn.execute(f"SELECT key, item FROM {_quote(self.table)} ORDER BY key")


# --- choosing a sink ----------------------------------------------------------------------


def sink_from_uri(uri: str, table: str = DEFAULT_ITEMS_TABLE) -> SQLiteSink | PostgresSink:
    """The sink a ``REDCRAWL_ITEMS_URI`` value names (not opened yet).

    ``sqlite:///rel/path.db`` and ``sqlite:////abs/path.db`` give a :class:`SQLiteSink`;
    ``postgresql://…`` (or ``postgres://…``) a :class:`PostgresSink`. Anything else is a
    :class:`~redcrawl.errors.ConfigError` naming ``REDCRAWL_ITEMS_URI``.
    """
    table = _check_table(table)
    if not isinstance(uri, str) or not uri.strip():
        raise ConfigError("REDCRAWL_ITEMS_URI", f"{uri!r} is not a URI; e.g. {DEFAULT_ITEMS_URI}")
    uri = uri.strip()
    scheme, sep, rest = uri.partition("://")
    scheme = scheme.lower()
    if sep and scheme == "sqlite":
        if not rest.startswith("/"):
            raise ConfigError(
                "REDCRAWL_ITEMS_URI",
                f"{uri!r}: an SQLite URI has no host; write sqlite:///relative/path.db "
                "or sqlite:////absolute/path.db",
            )
        path = rest[1:]
        if not path or path.endswith("/"):
            raise ConfigError("REDCRAWL_ITEMS_URI", f"{uri!r} names no database file")
        return SQLiteSink(path, table)
    if sep and scheme in ("postgresql", "postgres"):
        return PostgresSink(uri, table)
    raise ConfigError(
        "REDCRAWL_ITEMS_URI",
        f"{_redact(uri)!r}: unsupported scheme; use sqlite:///path.db, "
        "sqlite:////abs/path.db or postgresql://user:pass@host:port/db",
    )


def read_items(uri: str, table: str = DEFAULT_ITEMS_TABLE) -> dict[str, dict[str, Any]]:
    """Every item stored at ``uri`` in ``table``, as ``{key: item}``.

    A table that does not exist yet reads as empty; an SQLite file that does not exist is
    a :class:`FileNotFoundError` (most likely a wrong path). Nothing is created.
    """
    return dict(sink_from_uri(uri, table).items())


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
    naming the field; the crawl goes on. Stats: ``redcrawl/items_written``,
    ``redcrawl/items_dropped``.
    """

    def __init__(self, sink: Sink, *, key_field: str = DEFAULT_ITEM_KEY,
                 stats: StatsCollector | None = None, crawler: Crawler | None = None) -> None:
        if not isinstance(key_field, str) or not key_field:
            raise ConfigError("REDCRAWL_ITEM_KEY", f"{key_field!r}: give the name of an item "
                              "field, e.g. 'url'")
        self.sink = sink
        self.key_field = key_field
        self.stats = stats
        self.crawler = crawler
        self._spider_name: str | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> UpsertPipeline:
        settings = Settings.from_scrapy(crawler.settings)
        return cls(sink_from_uri(settings.items_uri, settings.items_table),
                   key_field=settings.item_key, stats=crawler.stats, crawler=crawler)

    # Recent Scrapy (2.19 here) calls these without the spider (a required spider argument is
    # deprecated there); older versions pass it.
    def open_spider(self, spider: Spider | None = None) -> None:
        self._spider_name = self._name_of(spider)
        self.sink.open()
        logger.info("UpsertPipeline: writing items to %r keyed by %r", self.sink,
                    self.key_field)

    def close_spider(self, spider: Spider | None = None) -> None:
        self.sink.close()

    def process_item(self, item: Any, spider: Spider | None = None) -> Any:
        try:
            adapter = ItemAdapter(item)
        except TypeError:
            self._dropped(f"{type(item).__name__} is not an item type (dict, scrapy.Item, "
                          "dataclass or attrs class)")
        key = self._key(adapter)
        text = self._encode(adapter)
        name = self._name_of(spider) if spider is not None else self._spider_name
        try:
            self.sink.upsert(key, text, name)
        except RejectedItem as exc:
            self._dropped(f"item {self.key_field}={key!r} not stored: {exc}")
        if self.stats is not None:
            self.stats.inc_value(STAT_WRITTEN)
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
            state = ("is missing" if field not in adapter
                     else "is None" if value is None else "is empty")
            self._dropped(f"key field {field!r} (REDCRAWL_ITEM_KEY) {state}; cannot store "
                          f"the item without it")
        if isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return self._dropped(f"key field {field!r} (REDCRAWL_ITEM_KEY) is a "
                             f"{type(value).__name__}; it must be a string or an integer")

    def _encode(self, adapter: ItemAdapter) -> str:
        data = adapter.asdict()
        try:
            return _dumps(data)
        except (TypeError, ValueError, RecursionError) as whole:
            for name, value in data.items():
                try:
                    _dumps({name: value})
                except (TypeError, ValueError, RecursionError) as exc:
                    return self._dropped(f"field {name!r} is not JSON-serialisable "
                                         f"({type(exc).__name__}: {exc})")
            return self._dropped(f"item is not JSON-serialisable ({whole})")


def _dumps(data: Any) -> str:
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    text.encode("utf-8")  # lone surrogates cannot be stored: UnicodeEncodeError (ValueError)
    return text
