"""Bringing a scrapy-redis dupefilter (a SET of hex SHA-1 fingerprints) into a crawl's
dedupe filter: :func:`import_hex_set` (``redcrawl import-dupefilter``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redcrawl.dedupe.filter import Filter
from redcrawl.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ImportResult:
    read: int
    added: int
    """New in the filter (the rest were there already)."""
    invalid: int
    """Members that are not 40 hex digits (skipped)."""
    example: str | None = None
    """One invalid member, for the message."""


def import_hex_set(
    source: Any,
    key: str,
    target: Filter,
    *,
    batch: int = 10_000,
    progress: Callable[[int], None] | None = None,
) -> ImportResult:
    """Stream a scrapy-redis dupefilter (a SET of 40-digit hex SHA-1 fingerprints) into
    ``target`` with SSCAN, one round trip per ``batch``. Safe on a live set and safe to
    repeat: SSCAN returns every member present for the whole scan, and re-adding is a no-op
    (members added meanwhile are picked up by running it again after switching over)."""
    kind = source.type(key)
    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
    if kind == "none":
        raise ConfigError(
            "import-dupefilter",
            f"key {key!r} does not exist on the source "
            "Redis; scrapy-redis names it '<spider>:dupefilter'",
        )
    if kind != "set":
        raise ConfigError(
            "import-dupefilter",
            f"key {key!r} is a {kind}, not the set of hex "
            "fingerprints a scrapy-redis dupefilter is",
        )
    read = added = invalid = 0
    example: str | None = None
    pending: list[bytes] = []

    def flush() -> None:
        nonlocal added
        added += sum(target.add(pending))
        pending.clear()

    for member in source.sscan_iter(key, count=batch):
        read += 1
        text = member.decode("ascii", "replace") if isinstance(member, bytes) else str(member)
        try:
            if len(text) != 40:
                raise ValueError
            pending.append(bytes.fromhex(text))
        except ValueError:
            invalid += 1
            example = example or text[:80]
            continue
        if len(pending) >= batch:
            flush()
            if progress is not None:
                progress(read)
    if pending:
        flush()
    return ImportResult(read, added, invalid, example)
