"""Where :class:`~redcrawl.scrapy.pipelines.UpsertPipeline` writes: an SQL table keyed by
the item's key (layout in :mod:`redcrawl.scrapy.pipelines`). ``sqlite.py`` and
``postgres.py`` hold the two sinks, ``common.py`` what they share; :func:`sink_from_uri`
picks one from ``REDCRAWL_ITEMS_URI``.
"""

from __future__ import annotations

from typing import Any

from redcrawl.errors import ConfigError
from redcrawl.scrapy.sinks.common import DEFAULT_ITEMS_TABLE as DEFAULT_ITEMS_TABLE
from redcrawl.scrapy.sinks.common import DEFAULT_ITEMS_URI as DEFAULT_ITEMS_URI
from redcrawl.scrapy.sinks.common import RejectedItem as RejectedItem
from redcrawl.scrapy.sinks.common import Sink as Sink
from redcrawl.scrapy.sinks.common import check_table, redact
from redcrawl.scrapy.sinks.postgres import PostgresSink as PostgresSink
from redcrawl.scrapy.sinks.sqlite import SQLiteSink as SQLiteSink

__all__ = ["PostgresSink", "RejectedItem", "SQLiteSink", "Sink", "read_items", "sink_from_uri"]


def sink_from_uri(uri: str, table: str = DEFAULT_ITEMS_TABLE) -> SQLiteSink | PostgresSink:
    """The sink a ``REDCRAWL_ITEMS_URI`` value names (not opened yet).

    ``sqlite:///rel/path.db`` and ``sqlite:////abs/path.db`` give a :class:`SQLiteSink`;
    ``postgresql://…`` (or ``postgres://…``) a :class:`PostgresSink`. Anything else is a
    :class:`~redcrawl.errors.ConfigError` naming ``REDCRAWL_ITEMS_URI``.
    """
    table = check_table(table)
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
        f"{redact(uri)!r}: unsupported scheme; use sqlite:///path.db, "
        "sqlite:////abs/path.db or postgresql://user:pass@host:port/db",
    )


def read_items(uri: str, table: str = DEFAULT_ITEMS_TABLE) -> dict[str, dict[str, Any]]:
    """Every item stored at ``uri`` in ``table``, as ``{key: item}``.

    A table that does not exist yet reads as empty; an SQLite file that does not exist is
    a :class:`FileNotFoundError` (most likely a wrong path). Nothing is created.
    """
    return dict(sink_from_uri(uri, table).items())
