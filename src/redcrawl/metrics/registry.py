"""The crawl registry: which crawls a Redis holds, in O(crawls) instead of a SCAN.

A frontier adds its crawl's name to :func:`redcrawl.keys.crawl_registry` (a SET) at its
first push. Crawls created before the registry existed (or by an older redcrawl) are
found by a SCAN over the stats keys (``rc:{*}:stats``) as before: the first full SCAN
pass adds every crawl it found to the set with the member :data:`COMPLETE`; from then on
readers read the set alone (one SMEMBERS, then one pipelined EXISTS of each crawl's stats
key, which drops purged crawls from the set). A crawl created later by a writer that does
not register (an older worker, keys written by hand) is not seen until the marker is
removed (``SREM rc:crawls {complete}``: the next reader scans again).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import redis

from redcrawl.keys import CrawlKeys, crawl_of_stats_key, crawl_registry, stats_key_pattern

__all__ = ["COMPLETE", "adopt", "alive", "all_crawls", "leftovers", "registered"]

COMPLETE = "{complete}"
"""The registry's member that says a full SCAN added every older crawl (a crawl name
has no braces)."""


def _text(raw: Any) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def registered(client: Any, prefix: str) -> tuple[set[str], bool]:
    """(the registered crawls whose stats key exists, whether the set is complete): one
    SMEMBERS, then one round of EXISTS checks; crawls whose stats key is gone (purged)
    are removed from the set."""
    members = {_text(m) for m in client.smembers(crawl_registry(prefix))}
    complete = COMPLETE in members
    names = sorted(members - {COMPLETE})
    if not names:
        return set(), complete
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.exists(CrawlKeys(name, prefix).stats)
    there = pipe.execute()
    gone = [n for n, e in zip(names, there, strict=True) if not e]
    if gone:
        client.srem(crawl_registry(prefix), *gone)
    return {n for n, e in zip(names, there, strict=True) if e}, complete


def adopt(client: Any, prefix: str, names: Iterable[str]) -> None:
    """After a full SCAN pass: add the crawls it found to the set, mark it complete. A
    Redis out of memory refuses it: the next listing scans again."""
    with contextlib.suppress(redis.exceptions.OutOfMemoryError):
        client.sadd(crawl_registry(prefix), *names, COMPLETE)


def all_crawls(client: Any, prefix: str) -> list[str]:
    """Every crawl (sorted): the registry, or once a full SCAN of the stats keys (which
    completes the registry)."""
    names, complete = registered(client, prefix)
    if complete:
        return sorted(names)
    scanned = {
        crawl_of_stats_key(k, prefix)
        for k in client.scan_iter(match=stats_key_pattern(prefix), count=1000)
    }
    found = {n for n in scanned if n is not None}
    adopt(client, prefix, found)
    return sorted(names | found)


COUNT_FIELDS = ("accepted", "filtered", "partitions")
"""Stats fields of which one is set in a crawl that exists (a partitioned crawl's anchor:
``partitions``)."""


def _has_counts(fields: list[Any]) -> bool:
    """Whether an ``HMGET`` of :data:`COUNT_FIELDS` found any."""
    return any(x is not None for x in fields)


PURGE_KEEPS = ("seq", "leases")
"""The stats fields a purge keeps (frontier/lua/purge.lua: old leases must stay stale)."""


def alive(client: Any, prefix: str, names: list[str], *, waiting: bool = False) -> list[bool]:
    """Whether each crawl exists, for every lister (the API, ``redcrawl crawls``, the
    metrics): its stats hold counts, or say how many partitions it has (a partitioned
    crawl's counts are its partitions'). A purge keeps only the id and lease-token
    counters (:data:`PURGE_KEEPS`), so a purged crawl is listed by none until a request
    is pushed to it again. ``waiting``: a crawl whose stats hold any other field counts
    too (a fleet's heartbeat counters before its first URL: the metrics show such a
    fleet; one pipelined ``HRANDFIELD stats 3`` per crawl, of which one field is not a
    purge's when the hash has more than two). A stats key that is not a hash counts (it
    is reported as corrupt); so does any crawl on a Redis without ``HRANDFIELD`` (before
    6.2) when ``waiting``. Errors are redis-py's."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        stats = CrawlKeys(name, prefix=prefix).stats
        if waiting:
            pipe.hrandfield(stats, 3)
        else:
            pipe.hmget(stats, *COUNT_FIELDS)
    replies = pipe.execute(raise_on_error=False)
    if waiting:
        keeps = {f.encode() for f in PURGE_KEEPS} | set(PURGE_KEEPS)
        return [not isinstance(r, list) or bool(set(r) - keeps) for r in replies]
    return [not isinstance(r, list) or _has_counts(r) for r in replies]


def leftovers(client: Any, prefix: str, name: str) -> bool:
    """Whether anything of crawl ``name`` is stored, for ``purge``: it counts as
    :func:`alive`, or any key purge deletes exists (:meth:`CrawlKeys.all_keys` but the
    stats hash, whose id counters a purge keeps; the dedupe filters' keys, streams and
    per-key politeness state by the SCAN patterns purge uses; any partition's keys). A
    crawl whose stats are gone but whose queues, control or workers are left is there;
    one that removed itself at its end, leaving only its final counts
    (:mod:`redcrawl.frontier.final`), is not.
    Errors are redis-py's."""
    if alive(client, prefix, [name])[0]:
        return True
    keys = CrawlKeys(name, prefix=prefix)
    if client.exists(*(k for k in keys.all_keys() if k not in (keys.stats, keys.final))):
        return True
    patterns = [
        keys.fp_done + ":*",
        keys.fp_seen + ":*",
        keys.stream_pattern(),
        *keys.pol_patterns(),
    ]
    for pattern in patterns:
        for _ in client.scan_iter(match=pattern, count=1000):
            return True
    # a partitioned crawl's partitions: ``<prefix>:{<crawl>/<p>}:…``; a partition's
    # stats hash holding only a purge's id counters is no leftover
    for raw in client.scan_iter(match=f"{prefix}:{{{name}/*}}:*", count=1000):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        if not key.endswith("}:stats"):
            return True
        if _has_counts(client.hmget(key, *COUNT_FIELDS)):
            return True
    return False
