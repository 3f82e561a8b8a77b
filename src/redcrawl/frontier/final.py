"""A finished crawl's last counts, kept when its state is removed (``SCHEDULER_PERSIST``
off): whoever removes the crawl (below) writes them just after its purge, with the
server's time, and ``redcrawl crawl`` reports them at its end if they were written after it started,
whether or not its progress reads ever saw the crawl running (a crawl can start and finish
between two of them). Stored under :attr:`~redcrawl.keys.CrawlKeys.final` as JSON, for
:data:`~redcrawl.keys.FINAL_TTL` seconds (a purge deletes them).

Who removes the state: :func:`purge_if_finished`, called by each worker of ``scrapy
crawl`` as it closes, and under ``redcrawl crawl`` by the command once all its workers
have exited (its workers are told so by :data:`COMMAND_PURGES_ENV`): the workers of one
command are one fleet, and one of them that starts late (after the others finished a
small crawl) must not find the crawl removed and crawl it all over again."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from redcrawl.errors import CrawlVanished, RedcrawlError
from redcrawl.frontier.base import Counts
from redcrawl.keys import FINAL_TTL, CrawlKeys
from redcrawl.lock import CrawlLock
from redcrawl.transport import redis_errors

__all__ = [
    "COMMAND_PURGES_ENV",
    "purge_if_finished",
    "read_final",
    "server_ms",
    "write_final",
]

COMMAND_PURGES_ENV = "_REDCRAWL_COMMAND_PURGES"
"""Set (to ``1``) in the environment of the workers of a ``redcrawl crawl`` whose
``SCHEDULER_PERSIST`` is off: the command removes the finished crawl's state once all of
them have exited, so they leave it. Not a ``REDCRAWL_*`` name: those are settings."""

PURGE_LOCK_WAIT = 10.0
"""Seconds :func:`purge_if_finished` waits for another caller's removal."""


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


def purge_if_finished(
    frontier: Any, *, exclude: str | None = None
) -> tuple[Counts, str | None] | None:
    """``SCHEDULER_PERSIST`` off: remove the crawl's state if it is finished and no worker
    of it (other than ``exclude``) has a current heartbeat, and leave its counts
    (:func:`write_final`; not for an empty crawl). Under the crawl's ``purge`` lock, so
    that of callers at the same moment (workers closing together, each signed off first)
    the last one sees the others gone and removes it, once: a second removal would delete
    the counts the first one left. Returns the counts removed and why they could not be
    kept (a Redis error, or None), or None when nothing was removed. Errors (but writing
    the counts) are the frontier's (:class:`~redcrawl.errors.RedcrawlError`)."""
    with CrawlLock(frontier.client, frontier.keys, "purge", ttl=30, wait=PURGE_LOCK_WAIT) as lock:
        if not lock.acquired:
            return None  # another caller is removing it
        now = frontier.server_time()
        if any(until > now and w != exclude for w, until in frontier.workers().items()):
            return None  # a live worker: it (or its command) removes it when it is done
        try:
            counts: Counts = frontier.counts()
        except CrawlVanished:
            return None  # removed already by another caller, or damaged: left in place
        if not counts.finished:
            return None
        if not counts.accepted:
            with redis_errors("reading the finished crawl's counts"):
                if frontier.client.exists(frontier.keys.final):
                    return None  # removed already, its counts kept: keep them
        stats = frontier.stats()
        frontier.purge()
        if not counts.accepted:
            return counts, None  # (an empty crawl: `redcrawl crawl` says so from Redis)
        try:
            with redis_errors("keeping the finished crawl's counts"):
                write_final(frontier.client, frontier.keys, counts, stats)
        except RedcrawlError as exc:
            return counts, str(exc)
        return counts, None
