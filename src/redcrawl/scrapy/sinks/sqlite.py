"""The SQLite sink: items in one SQLite file in WAL mode, shared by the worker processes."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from redcrawl.scrapy.sinks.common import (
    DEFAULT_ITEMS_TABLE,
    check_columns,
    check_table,
    quote,
    upsert_sql,
)

logger = logging.getLogger(__name__)

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

    def __init__(
        self,
        path: str | Path,
        table: str = DEFAULT_ITEMS_TABLE,
        *,
        timeout: float = 60.0,
        synchronous: str = "NORMAL",
    ) -> None:
        self.path = Path(path)
        self.table = check_table(table)
        if synchronous.upper() not in ("NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous={synchronous!r}: use NORMAL, FULL or EXTRA")
        self.synchronous = synchronous.upper()
        self.timeout = timeout
        self._conn: sqlite3.Connection | None = None
        self._upsert_sql = upsert_sql(
            self.table,
            {
                "key": "?",
                "item": "?",
                "spider": "?",
                "first_seen": _SQLITE_NOW,
                "updated_at": _SQLITE_NOW,
                "version": "1",
            },
            updated_at="excluded.updated_at",
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
        t = quote(self.table)
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
        check_columns(self.table, columns)

    def upsert(self, key: str, item_json: str, spider: str | None) -> bool:
        if self._conn is None:
            raise RuntimeError(f"{self!r} is not open")
        # Autocommit mode: the statement is its own transaction, committed once its
        # RETURNING rows are all read.
        rows = self._conn.execute(self._upsert_sql, (key, item_json, spider)).fetchall()
        return bool(rows) and rows[0][0] == 1

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
                f"SELECT key, item FROM {quote(self.table)} ORDER BY key"
            ):
                yield key, json.loads(text)
        finally:
            conn.close()
