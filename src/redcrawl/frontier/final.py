"""A finished crawl's last counts, kept when its state is removed (``SCHEDULER_PERSIST``
off): the last worker writes them just after it purges the crawl, and ``redcrawl
crawl`` reports them at its end, whether or not its progress reads ever saw the crawl
running (a crawl can start and finish between two of them). Stored under
:attr:`~redcrawl.keys.CrawlKeys.final` as JSON, for :data:`~redcrawl.keys.FINAL_TTL`
seconds (a purge deletes them); ``redcrawl crawl`` deletes an earlier run's before
its workers start."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from redcrawl.frontier.base import Counts
from redcrawl.keys import FINAL_TTL, CrawlKeys

__all__ = ["clear_final", "read_final", "write_final"]


def write_final(client: Any, keys: CrawlKeys, counts: Counts, stats: dict[str, int]) -> None:
    """Keep ``counts`` and ``stats`` of the finished crawl. Errors are redis-py's."""
    doc = {"counts": dataclasses.asdict(counts), "stats": stats}
    client.set(keys.final, json.dumps(doc, separators=(",", ":")), ex=FINAL_TTL)


def read_final(client: Any, keys: CrawlKeys) -> tuple[Counts, dict[str, int]] | None:
    """The counts and stats kept by :func:`write_final`, or None (none kept, or not
    readable: a key written by something else). Errors are redis-py's."""
    raw = client.get(keys.final)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        fields = {f.name for f in dataclasses.fields(Counts)}
        counts = Counts(**{k: int(v) for k, v in doc["counts"].items() if k in fields})
        stats = {str(k): int(v) for k, v in doc["stats"].items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return counts, stats


def clear_final(client: Any, keys: CrawlKeys) -> None:
    """Forget an earlier run's counts (a new run starts). Errors are redis-py's."""
    client.delete(keys.final)
