"""The PostgreSQL sink: items in a JSONB table via psycopg 3 (imported only when used)."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterator
from typing import Any

from redcrawl.errors import ConfigError
from redcrawl.scrapy.sinks.common import (
    DEFAULT_ITEMS_TABLE,
    RejectedItem,
    check_columns,
    check_table,
    quote,
    redact,
    upsert_sql,
)

logger = logging.getLogger(__name__)

_PG_INSTALL_HINT = 'pip install "redcrawl[postgres]"'


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise ConfigError(
            "REDCRAWL_ITEMS_URI",
            "a postgresql:// URI needs psycopg 3, which is not installed: "
            f'{_PG_INSTALL_HINT} (or pip install "psycopg[binary]")',
        ) from exc
    return psycopg


class PostgresSink:
    """Items in a PostgreSQL table (``item`` is JSONB), via psycopg 3.

    The connection is in autocommit mode, so each upsert is its own transaction and is
    committed (with PostgreSQL's usual durability) when :meth:`upsert` returns. A lost
    connection is reopened once and the upsert retried; repeating it is harmless since
    an upsert is idempotent apart from the ``version`` counter.
    """

    def __init__(
        self, dsn: str, table: str = DEFAULT_ITEMS_TABLE, *, connect_timeout: float = 10.0
    ) -> None:
        self._pg = _psycopg()  # fail at construction (crawler start), not mid-crawl
        self.dsn = dsn
        self.table = check_table(table)
        self.connect_timeout = connect_timeout
        self._conn: Any = None
        self._upsert_sql = upsert_sql(
            self.table, {"key": "%s", "item": "%s::jsonb", "spider": "%s"}, updated_at="now()"
        )

    def __repr__(self) -> str:
        return f"PostgresSink({redact(self.dsn)!r}, table={self.table!r})"

    def _connect(self) -> Any:
        return self._pg.connect(
            self.dsn,
            autocommit=True,
            connect_timeout=max(1, round(self.connect_timeout)),
            application_name="redcrawl",
        )

    def open(self) -> None:
        if self._conn is not None:
            return
        conn = self._connect()
        try:
            t = quote(self.table)
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
            check_columns(self.table, {r[0] for r in rows})
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def upsert(self, key: str, item_json: str, spider: str | None) -> bool:
        if self._conn is None:
            raise RuntimeError(f"{self!r} is not open")
        try:
            return self._execute_upsert(key, item_json, spider)
        except self._pg.OperationalError:
            if not self._conn.closed:
                raise
            logger.warning("%r: connection lost; reconnecting and retrying once", self)
            self._conn = self._connect()
            return self._execute_upsert(key, item_json, spider)

    def _execute_upsert(self, key: str, item_json: str, spider: str | None) -> bool:
        try:
            rows = self._conn.execute(self._upsert_sql, (key, item_json, spider)).fetchall()
            return bool(rows) and rows[0][0] == 1
        except self._pg.DataError as exc:
            raise RejectedItem(f"PostgreSQL refused the item: {exc}".strip()) from exc

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every stored ``(key, item)``, by key; nothing if the table does not exist."""
        with self._connect() as conn:
            exists = conn.execute("SELECT to_regclass(%s)", (quote(self.table),)).fetchone()
            if exists is None or exists[0] is None:
                return
            yield from conn.execute(f"SELECT key, item FROM {quote(self.table)} ORDER BY key")
