"""What the SQL sinks share: the :class:`Sink` protocol, :class:`RejectedItem`, the
table's columns, and table-name checks (the table is described in
:mod:`redcrawl.scrapy.pipelines`)."""

from __future__ import annotations

import re
from typing import Protocol

from redcrawl.errors import ConfigError
from redcrawl.settings import Settings

DEFAULT_ITEMS_URI = Settings().items_uri
DEFAULT_ITEMS_TABLE = Settings().items_table
DEFAULT_ITEM_KEY = Settings().item_key

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_MAX_IDENTIFIER = 63  # PostgreSQL's limit; longer names would be silently truncated there
COLUMNS = ("key", "item", "spider", "first_seen", "updated_at", "version")


class RejectedItem(ValueError):
    """The database refused this one item (e.g. PostgreSQL and a NUL character in text).

    Raised by a sink's ``upsert``; nothing was written and the connection is still usable.
    :class:`UpsertPipeline` turns it into :class:`~scrapy.exceptions.DropItem`.
    """


class Sink(Protocol):
    """Where :class:`UpsertPipeline` writes. ``upsert`` returns only once the row is committed."""

    def open(self) -> None:
        """Connect, and create the table if it is missing."""

    def upsert(self, key: str, item_json: str, spider: str | None) -> bool:
        """Insert or replace the item stored under ``key``; committed when this returns.
        Returns True if the key was new (inserted), False if it replaced a stored item."""

    def close(self) -> None:
        """Release the connection. Safe to call twice."""


def check_table(table: object) -> str:
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


def quote(identifier: str) -> str:
    # Validated by check_table, so it holds no quote; quoting lets reserved words
    # ("order", "user") work as table names.
    return f'"{identifier}"'


def redact(uri: str) -> str:
    """The URI without its password, for messages and logs."""
    return re.sub(r"(://[^:/?#@]*:)[^@/?#]*@", r"\1***@", uri)


def upsert_sql(table: str, values: dict[str, str], *, updated_at: str) -> str:
    """The one upsert statement of both sinks: insert ``values`` (column -> SQL value),
    or on a key already stored replace its item and spider, set ``updated_at`` and bump
    ``version``; it returns the row's ``version`` (1: inserted)."""
    t = quote(table)
    return (
        f"INSERT INTO {t} ({', '.join(values)}) VALUES ({', '.join(values.values())}) "
        "ON CONFLICT (key) DO UPDATE SET item = excluded.item, spider = excluded.spider, "
        f"updated_at = {updated_at}, version = {t}.version + 1 RETURNING version"
    )


def check_columns(table: str, columns: set[str]) -> None:
    missing = [c for c in COLUMNS if c not in columns]
    if missing:
        raise ConfigError(
            "REDCRAWL_ITEMS_TABLE",
            f"table {table!r} already exists but is not an items table (no column "
            f"{', '.join(missing)}); choose another table name",
        )
