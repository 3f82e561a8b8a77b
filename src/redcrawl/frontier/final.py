"""A finished crawl's last counts, kept when its state is removed (``SCHEDULER_PERSIST``
off): the last worker writes them just after it purges the crawl, with the server's time,
and ``redcrawl crawl`` reports them at its end if they were written after it started,
whether or not its progress reads ever saw the crawl running (a crawl can start and finish
between two of them). Stored under :attr:`~redcrawl.keys.CrawlKeys.final` as JSON, for
:data:`~redcrawl.keys.FINAL_TTL` seconds (a purge deletes them)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from redcrawl.frontier.base import Counts
from redcrawl.keys import FINAL_TTL, CrawlKeys

__all__ = ["read_final", "server_ms", "write_final"]


def server_ms(client: Any) -> int:
    """Redis's clock (ms). Errors are redis-py's."""
    sec, usec = client.time()
    return int(sec) * 1000 + int(usec) // 1000


def write_final(client: Any, keys: CrawlKeys, counts: Counts, stats: dict[str, int]) -> None:
    """Keep ``counts`` and ``stats`` of the finished crawl, stamped with the server's
    time. Errors are redis-py's."""
    doc = {"at": server_ms(client), "counts": dataclasses.asdict(counts), "stats": stats}
    client.set(keys.final, json.dumps(doc, separators=(",", ":")), ex=FINAL_TTL)


def read_final(
    client: Any, keys: CrawlKeys, since: int = 0
) -> tuple[Counts, dict[str, int]] | None:
    """The counts and stats kept by :func:`write_final` at ``since`` (server ms) or
    later, or None (none kept, kept by an earlier run, or not readable: a key written by
    something else). Errors are redis-py's."""
    raw = client.get(keys.final)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        if int(doc["at"]) < since:
            return None
        fields = {f.name for f in dataclasses.fields(Counts)}
        counts = Counts(**{k: int(v) for k, v in doc["counts"].items() if k in fields})
        stats = {str(k): int(v) for k, v in doc["stats"].items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return counts, stats
