"""Copy a stopped crawl to another Redis: ``redcrawl migrate --to URL`` (docs/cluster.md,
"Moving a crawl").

:func:`copy_crawl` moves every key of one crawl from a source Redis (a single server or a
cluster) to a target (a single server or a Redis Cluster, ``redis+cluster://``) with
``DUMP``/``RESTORE``, in pipelined batches, keys' remaining lifetimes kept:

1. **Checks, before anything is written.** The crawl exists in the source; it is stopped
   (no live worker heartbeat, no lease whose deadline is still ahead: otherwise a
   :class:`~redcrawl.errors.FrontierError` says to stop the workers or wait for the
   leases to expire; ``force_expire`` copies anyway); the target is another Redis (or
   another database) and holds no key of a crawl of that name (``replace`` deletes that
   crawl first). The target's ``migrate`` lock is held while it copies.
2. **Which keys.** The crawl's fixed keys (:meth:`~redcrawl.keys.CrawlKeys.all_keys`)
   that exist, and every key matching one of the crawl's SCAN patterns (:func:`crawl_patterns`:
   the per-key politeness queues and states of
   :meth:`~redcrawl.keys.CrawlKeys.pol_patterns`, the streams, the dedupe filters' keys,
   RedisSpider start URLs). The patterns are scanned once per hash tag (a cluster scans
   only that tag's master). Keys of the crawl matched by neither (locks, a worker's
   counters: keys that expire by themselves) are listed in :attr:`CopyResult.skipped`
   and not copied. So a key added to ``all_keys`` or to a pattern later is copied without
   new code here.
3. **Copy**: one pipelined ``TYPE``/``PTTL``/``DUMP`` round per batch on the source, one
   pipelined ``RESTORE`` round on the target (a key that expired meanwhile is skipped).
   Streams are copied whole: their entries, consumer group and pending entries list
   (``DUMP`` carries them), not rebuilt.
4. **Verify** before reporting success: every copied key's size (``LLEN``, ``ZCARD``,
   ``HLEN``, ``SCARD``, ``XLEN``, ``STRLEN``) equal on both sides, the crawl's
   :class:`~redcrawl.frontier.Counts` and its whole stats hash equal on the target and
   unchanged on the source. Any difference deletes what was restored and raises.
5. **In flight back to ready, in the copy only**: each worker's heartbeat and leases in
   the copy end (``release_worker``) and ``maintain`` reclaims them, as an expired lease
   is reclaimed: back to READY (the delivery counted as an attempt; a request whose
   attempts are used up goes to DEAD, as it would in the source) — and delayed requests
   already due are promoted, as the next lease would. Checked: nothing in flight,
   accepted and done unchanged, the conservation law holds.
6. The source is left as it was, unless ``delete_source``: its copied keys are then
   deleted after the verification (and only if it is still unchanged).

The copy keeps the crawl's layout: a crawl of one partition (``{crawl}``) copied into a
cluster lives on the master of its slot; a crawl of P partitions is copied with every
partition (``{crawl/p}``), each landing on the master of its own slot. Spreading a
one-partition crawl over partitions is not done here.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis
import redis.exceptions

from redcrawl.errors import ConfigError, FrontierError, LayoutMismatch
from redcrawl.frontier import Counts, FrontierCore, open_frontier
from redcrawl.frontier.records import layout_without_stamps, stored_layout
from redcrawl.keys import CrawlKeys, crawl_registry
from redcrawl.lock import CrawlLock
from redcrawl.migrate_rehome import Rehomed, check_partitions, rehome_crawl, source_parts
from redcrawl.settings import Settings
from redcrawl.transport import redis_errors

__all__ = [
    "BATCH",
    "CopyResult",
    "Progress",
    "copy_crawl",
    "crawl_patterns",
    "crawl_redis_keys",
    "key_sets",
]

BATCH = 200
"""Keys per pipelined round (DUMP on the source, RESTORE on the target)."""
BATCH_BYTES = 64 << 20
"""A RESTORE round is sent once the payloads it holds pass this many bytes."""
LOCK_TTL = 120.0

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: stages ``listing``, ``copying``, ``verifying``,
``deleting source`` (``total`` 0 when not known yet)."""

_SIZE = {
    "string": "STRLEN",
    "list": "LLEN",
    "set": "SCARD",
    "zset": "ZCARD",
    "hash": "HLEN",
    "stream": "XLEN",
}


@dataclass
class CopyResult:
    """What :func:`copy_crawl` found and did."""

    crawl: str
    keys: int = 0
    """Keys copied (or, in a dry run, to copy)."""
    parts: dict[str, int] = field(default_factory=dict)
    """Keys by part of their name after the hash tag (``req``, ``ready``, ``pol``, ...)."""
    size: int = 0
    """Bytes of DUMP payloads copied (0 in a dry run)."""
    expired: int = 0
    """Keys with a time to live that expired between listing and copying (not copied)."""
    skipped: list[str] = field(default_factory=list)
    """Keys of the crawl not copied: they expire by themselves (locks, worker counters)."""
    before: Counts | None = None
    """The crawl's counts in the source (and, verified, in the copy as restored)."""
    after: Counts | None = None
    """The copy's counts once its in-flight requests went back (None in a dry run)."""
    returned: int = 0
    """In-flight requests the copy took back to READY."""
    dead_lettered: int = 0
    """In-flight requests that had used their last attempt: DEAD in the copy."""
    promoted: int = 0
    """Delayed requests already due, promoted to READY in the copy."""
    live_workers: int = 0
    held_leases: int = 0
    """Requests under a lease whose deadline is ahead in the source (lists; copied only
    with ``force_expire``)."""
    replaced: int = 0
    """Keys of the target's crawl of that name deleted first (``replace``)."""
    source_deleted: bool = False
    dry_run: bool = False
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    copied: list[bytes] = field(default_factory=list, repr=False)
    """The keys restored in the target."""
    stats: dict[bytes, bytes] = field(default_factory=dict, repr=False)
    """The crawl's stats hash as copied."""
    rehome: Rehomed | None = None
    """Into another number of partitions (``partitions``): what was placed where."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- which keys --------------------------------------------------------------------------


def crawl_patterns(keys: CrawlKeys) -> list[str]:
    """SCAN patterns of the crawl's keys whose names are not fixed: per-key politeness
    queues and states, streams, the dedupe filters' keys, RedisSpider start URLs."""
    return [
        *keys.pol_patterns(),
        keys.stream_pattern(),
        f"{keys.fp_done}:*",
        f"{keys.fp_seen}:*",
        keys.start_urls("*"),
    ]


def _scan_prefixes(keys: CrawlKeys, patterns: Sequence[str]) -> list[str]:
    """One SCAN pattern per hash tag the patterns name (``rc:{crawl}:*``), so a crawl is
    scanned once per tag, whatever the number of patterns."""
    out: list[str] = []
    for p in [*patterns, keys.stats]:
        end = p.find("}")
        prefix = (p[: end + 1] + "*") if end >= 0 else p
        if prefix not in out:
            out.append(prefix)
    return out


def key_sets(frontier: FrontierCore) -> list[CrawlKeys]:
    """The crawl's key names: its own, and each partition's when it has partitions."""
    return [frontier.keys, *(sub.keys for sub in getattr(frontier, "parts", ()))]


def crawl_redis_keys(
    client: Any,
    keys: CrawlKeys | Sequence[CrawlKeys],
    *,
    progress: Progress | None = None,
) -> tuple[list[bytes], list[bytes]]:
    """(keys of the crawl to copy, keys of the crawl that are not copied) in ``client``:
    the fixed keys that exist, then the keys matching :func:`crawl_patterns`; any other
    key under the crawl's hash tags is the second list. ``keys``: the crawl's names, or
    all of them for a crawl of several partitions (:func:`key_sets`)."""
    sets = [keys] if isinstance(keys, CrawlKeys) else list(keys)
    fixed = list(dict.fromkeys(k for one in sets for k in one.all_keys()))
    patterns = [p for one in sets for p in crawl_patterns(one)]
    found: list[bytes] = []
    with redis_errors("listing the crawl's keys"):
        pipe = client.pipeline(transaction=False)
        for name in fixed:
            pipe.exists(name)
        for name, there in zip(fixed, pipe.execute(), strict=True):
            if there:
                found.append(name.encode())
        known = set(found)
        fixed_set = {k.encode() for k in fixed}
        other: list[bytes] = []
        prefixes = dict.fromkeys(x for one in sets for x in _scan_prefixes(one, patterns))
        for prefix in prefixes:
            for key in client.scan_iter(match=prefix, count=1000):
                key = bytes(key)
                if key in fixed_set or key in known:
                    continue
                text = key.decode("latin-1")
                if any(fnmatch.fnmatchcase(text, p) for p in patterns):
                    known.add(key)
                    found.append(key)
                else:
                    other.append(key)
                if progress is not None and len(found) % 10_000 == 0:
                    progress("listing", len(found), 0)
    return found, other


def _part(key: bytes) -> str:
    """The part of a key's name after its hash tag, up to the next ``:``."""
    text = key.decode("latin-1")
    rest = text[text.find("}") + 2 :] if "}" in text else text
    return rest.split(":", 1)[0] or "?"


# --- checks ------------------------------------------------------------------------------


def _layout_refusal(frontier: FrontierCore) -> str | None:
    """Why this process's settings could not run the crawl's scripts (the check of
    ``lua/lib.lua``, read in Python so that nothing is written), or None. A crawl of
    several partitions: its partitions' layouts (where its scripts run)."""
    for part in getattr(frontier, "parts", ()):
        refusal = _layout_refusal(part)
        if refusal is not None:
            return refusal
    if hasattr(frontier, "parts"):
        return None
    with redis_errors("reading the crawl layout"):
        raw = stored_layout(frontier.client.hgetall(frontier.keys.control))
    if raw is None:
        return None
    mine = " ".join(frontier._common).encode()  # (ARGV[1..3] of every frontier script)
    if layout_without_stamps(raw) == mine:
        return None
    return (
        f"crawl {frontier.crawl!r} was created with the layout {raw.decode(errors='replace')!r} "
        f"and these settings give {mine.decode(errors='replace')!r}: run the command with "
        "the settings of the crawl's workers (REDCRAWL_TIER_BOUNDS, REDCRAWL_DEDUPE, "
        "REDCRAWL_DEDUPE_CAPACITY, REDCRAWL_DEDUPE_ERROR_RATE, REDCRAWL_RECRAWL_AFTER, "
        "REDCRAWL_TIERS), so that its in-flight requests can be given back in the copy"
    )


def _running(frontier: FrontierCore, counts: Counts) -> tuple[int, int, float]:
    """(live workers, requests under a lease whose deadline is ahead, seconds until the last
    of them ends)
    of a crawl. A streams lease has no deadline of its own (an entry is reclaimed once
    its worker's heartbeat has stopped and it has been idle for the reclaiming worker's
    lease ttl): there, only heartbeats count."""
    now = frontier.server_time()
    beats = [t for t in frontier.workers().values() if t > now]
    held = (
        [i.deadline for i in frontier.inflight(limit=counts.in_flight + 1) if i.deadline > now]
        if counts.in_flight and frontier.BACKEND != "streams"
        else []
    )
    return len(beats), len(held), max([*beats, *held], default=now) - now


def _server_id(client: Any) -> tuple[str, int] | None:
    """(run id, database) of a single server; None for a cluster."""
    if hasattr(client, "nodes_manager"):
        return None
    info = client.info("server")
    db = int(client.connection_pool.connection_kwargs.get("db", 0) or 0)
    return str(info.get("run_id")), db


def _version(client: Any) -> str:
    try:
        return str(client.info("server").get("redis_version", "?"))
    except redis.exceptions.RedisError:
        return "?"


def _check_target(
    source: Any, target: Any, keys: Sequence[CrawlKeys], replace: bool
) -> tuple[list[bytes], list[str]]:
    """The target's keys of a crawl of this name (to delete with ``replace``); refuses
    the source itself and an existing crawl without ``replace``."""
    warnings: list[str] = []
    with redis_errors("reading the target"):
        here, there = _server_id(source), _server_id(target)
    if here is not None and here == there:
        raise ConfigError(
            "--to",
            f"the target is the source itself (the same Redis server, database {here[1]}); "
            "give the URL of another Redis server, another database, or a cluster",
        )
    existing, _other = crawl_redis_keys(target, keys)
    if existing and not replace:
        raise FrontierError(
            f"the target already holds a crawl named {keys[0].crawl!r} ({len(existing)} "
            "keys); nothing was copied. Purge it there, or give --replace to delete it and "
            "copy this one in its place"
        )
    if existing:
        warnings.append(
            f"the target's crawl {keys[0].crawl!r} ({len(existing)} keys) was deleted first "
            "(--replace)"
        )
    return existing, warnings


# --- the copy ----------------------------------------------------------------------------


@dataclass
class _Copied:
    key: bytes
    kind: str
    volatile: bool


def _dump_restore(
    source: Any,
    target: Any,
    batch: Sequence[bytes],
    copied: list[_Copied],
    result: CopyResult,
) -> None:
    with redis_errors("reading the source's keys (DUMP)"):
        pipe = source.pipeline(transaction=False)
        for key in batch:
            pipe.type(key)
            pipe.pttl(key)
            pipe.dump(key)
        replies = pipe.execute()
    restores: list[tuple[bytes, int, bytes, str]] = []
    for i, key in enumerate(batch):
        kind, ttl, payload = replies[3 * i : 3 * i + 3]
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        if payload is None or kind == "none" or ttl == -2:
            result.expired += 1
            continue
        restores.append((key, max(int(ttl), 0), bytes(payload), kind))
    size = 0
    start = 0
    for i, (_key, _ttl, payload, _kind) in enumerate(restores):
        size += len(payload)
        if size >= BATCH_BYTES or i == len(restores) - 1:
            _restore(target, restores[start : i + 1], copied, result)
            start, size = i + 1, 0


def _restore(
    target: Any,
    items: Sequence[tuple[bytes, int, bytes, str]],
    copied: list[_Copied],
    result: CopyResult,
) -> None:
    with redis_errors("writing the target's keys (RESTORE)"):
        pipe = target.pipeline(transaction=False)
        for key, ttl, payload, _kind in items:
            pipe.restore(key, ttl, payload)
        replies = pipe.execute(raise_on_error=False)
    for (key, ttl, payload, kind), reply in zip(items, replies, strict=True):
        if isinstance(reply, Exception):
            raise _restore_error(target, key, reply)
        copied.append(_Copied(key, kind, ttl > 0))
        result.size += len(payload)
        result.keys += 1
        part = _part(key)
        result.parts[part] = result.parts.get(part, 0) + 1


def _restore_error(target: Any, key: bytes, exc: Exception) -> FrontierError:
    text = str(exc)
    if "payload version" in text or "checksum" in text:
        return FrontierError(
            f"the target (Redis {_version(target)}) cannot read the source's DUMP payloads "
            f"({text}): a key restores only into the same Redis version or a newer one; "
            "upgrade the target. Nothing is left in the target"
        )
    if "BUSYKEY" in text:
        return FrontierError(
            f"{key.decode(errors='replace')} appeared in the target while copying (another "
            "copy or a worker writes there); nothing is left in the target: stop it and run "
            "again"
        )
    return FrontierError(f"the target refused RESTORE of {key.decode(errors='replace')}: {text}")


def _sizes(client: Any, items: Sequence[_Copied]) -> list[int | None]:
    """Each key's size by its type (None: the key is gone)."""
    out: list[int | None] = []
    for start in range(0, len(items), 1000):
        chunk = items[start : start + 1000]
        pipe = client.pipeline(transaction=False)
        for c in chunk:
            pipe.exists(c.key)
            command = _SIZE.get(c.kind)
            if command is None:
                pipe.exists(c.key)  # (a module type: its presence is what is checked)
            else:
                pipe.execute_command(command, c.key)
        replies = pipe.execute()
        for i in range(len(chunk)):
            there, size = replies[2 * i], replies[2 * i + 1]
            out.append(int(size) if there else None)
    return out


def _stats(frontier: FrontierCore) -> dict[bytes, bytes]:
    with redis_errors("reading the crawl's stats"):
        return dict(frontier.client.hgetall(frontier.keys.stats))


def _delete(client: Any, keys: Iterable[bytes], what: str) -> None:
    batch = list(keys)
    with redis_errors(what):
        for start in range(0, len(batch), 500):
            pipe = client.pipeline(transaction=False)
            for key in batch[start : start + 500]:
                pipe.unlink(key)  # (one key a command: a cluster's keys may be on any master)
            pipe.execute()


def _verify(
    source: FrontierCore,
    target: FrontierCore,
    copied: Sequence[_Copied],
    before: Counts,
    stats: dict[bytes, bytes],
    progress: Progress | None,
) -> None:
    """Raise :class:`FrontierError` unless the copy equals the source, key by key and in
    counts, and the source did not change."""
    if progress is not None:
        progress("verifying", 0, len(copied))
    with redis_errors("verifying the copy"):
        mine, theirs = _sizes(source.client, copied), _sizes(target.client, copied)
    wrong = [
        f"{c.key.decode(errors='replace')} ({a} in the source, {b} in the copy)"
        for c, a, b in zip(copied, mine, theirs, strict=True)
        if a != b and not (c.volatile and (a is None or b is None))
    ]
    if wrong:
        raise FrontierError(
            f"{len(wrong)} key(s) differ between the source and the copy, e.g. {wrong[0]}; "
            "the crawl changed while it was copied (are its workers stopped?). Nothing is "
            "left in the target: run again once the crawl is stopped"
        )
    if source.counts() != before or _stats(source) != stats:
        raise FrontierError(
            f"crawl {source.crawl!r} changed in the source while it was copied: a worker "
            "or a client still writes to it. Nothing is left in the target: stop every "
            "worker (and feeder) of the crawl and run again"
        )
    got = target.counts()
    if got != before or _stats(target) != stats:
        raise FrontierError(
            f"the copy's counts differ from the source's ({got} vs {before}); nothing is "
            "left in the target"
        )
    if progress is not None:
        progress("verifying", len(copied), len(copied))


def _give_back(target: FrontierCore, before: Counts, result: CopyResult) -> Counts:
    """End the copy's workers and reclaim their leases (see the module docstring)."""
    holders = {i.worker for i in target.inflight(limit=before.in_flight + 1)}
    for worker in sorted(holders | set(target.workers())):
        target.release_worker(worker)  # (then maintain(): some may be promoted here)
    with redis_errors("giving back the copy's leases"):
        while any(target.maintain()):
            pass
    after = target.counts()
    result.dead_lettered = after.dead - before.dead
    result.promoted = before.delayed - after.delayed
    result.returned = before.in_flight - result.dead_lettered
    if (
        after.in_flight
        or not after.conserved
        or after.accepted != before.accepted
        or after.done != before.done
        or result.promoted < 0
        or result.dead_lettered < 0
    ):
        raise FrontierError(
            f"giving back the copy's in-flight requests left it at {after} (was {before}); "
            "nothing is left in the target"
        )
    return after


def copy_crawl(
    source: Any,
    target: Any,
    settings: Settings,
    crawl: str,
    *,
    replace: bool = False,
    force_expire: bool = False,
    delete_source: bool = False,
    dry_run: bool = False,
    batch: int = BATCH,
    progress: Progress | None = None,
    partitions: int | None = None,
) -> CopyResult:
    """Copy the stopped crawl ``crawl`` from ``source`` to ``target`` (redis-py clients,
    single servers or :class:`~redcrawl.cluster.ClusterClient`), as the module docstring
    says. ``settings`` are the crawl's (key prefix, tiers, dedupe; the backend and
    ordering follow the crawl's stored layout). ``dry_run`` checks everything and lists
    the keys, writing nothing. Returns what was done; raises
    :class:`~redcrawl.errors.FrontierError` (running crawl, existing target crawl, a copy
    that does not verify: the target is then left without the crawl),
    :class:`~redcrawl.errors.ConfigError` (the target is the source, a partition count
    out of range) or a :class:`~redcrawl.errors.ConnectionError_`. ``partitions``: the
    copy's partition count (None: the source's); another count than the source's
    re-homes the crawl (:mod:`redcrawl.migrate_rehome`)."""
    started = time.monotonic()
    result = CopyResult(crawl, dry_run=dry_run)
    src = open_frontier(source, settings, crawl, follow_layout=True)
    keys = src.keys
    if partitions is not None:
        check_partitions(len(source_parts(src)), partitions)
        if partitions != len(source_parts(src)):
            rehome_crawl(
                src,
                target,
                partitions,
                result,
                replace=replace,
                force_expire=force_expire,
                delete_source=delete_source,
                dry_run=dry_run,
                batch=batch,
                progress=progress,
            )
            result.seconds = time.monotonic() - started
            return result
    existing = _preflight(src, target, result, force_expire=force_expire, replace=replace)
    todo, other = crawl_redis_keys(source, key_sets(src), progress=progress)
    result.skipped = [k.decode(errors="replace") for k in other]
    result.replaced = len(existing)
    if dry_run:
        result.keys = len(todo)
        for key in todo:
            result.parts[_part(key)] = result.parts.get(_part(key), 0) + 1
    else:
        lock = CrawlLock(target, keys, "migrate", ttl=LOCK_TTL)
        if not lock.acquire():
            raise FrontierError(
                f"another copy into the target's crawl {crawl!r} is running (lock "
                f"{keys.lock('migrate')}); wait for it to end"
            )
        try:
            _copy(src, target, settings, todo, existing, result, lock, batch, progress)
            if delete_source:
                _delete_source(src, result, progress)
        finally:
            if lock.acquired:
                lock.release()
    result.seconds = time.monotonic() - started
    return result


def _preflight(
    src: FrontierCore,
    target: Any,
    result: CopyResult,
    *,
    force_expire: bool,
    replace: bool,
    target_keys: Sequence[CrawlKeys] | None = None,
) -> list[bytes]:
    """The checks before anything is written (see the module docstring); returns the
    target's keys of a crawl of that name (to delete: ``replace``)."""
    keys, crawl = src.keys, src.crawl
    with redis_errors("reading the source crawl"):
        exists = src.client.exists(keys.stats) or src.client.exists(keys.control)
    if not exists:
        raise FrontierError(
            f"no crawl named {crawl!r} in the source Redis; `redcrawl crawls` lists its crawls"
        )
    before = result.before = src.counts()
    live, held, wait = _running(src, before)
    result.live_workers, result.held_leases = live, held
    if (live or held) and not force_expire:
        raise FrontierError(
            f"crawl {crawl!r} is running: {live} live worker(s), {held} request(s) leased "
            f"(for {wait:.0f} s more at most); nothing was copied. Stop its workers (Ctrl-C "
            "on `redcrawl crawl`), or wait until their heartbeats and leases expire, and run "
            "again; --force-expire copies it now, its leases given back in the copy (only "
            "if you know those workers are gone: a worker still running changes the source "
            "and the copy is refused)"
        )
    if before.in_flight or live:
        refusal = _layout_refusal(src)
        if refusal is not None:
            raise LayoutMismatch(f"{refusal}; nothing was copied")
    existing, result.warnings = _check_target(
        src.client, target, target_keys or key_sets(src), replace
    )
    return existing


def _copy(
    src: FrontierCore,
    target: Any,
    settings: Settings,
    todo: Sequence[bytes],
    existing: Sequence[bytes],
    result: CopyResult,
    lock: CrawlLock,
    batch: int,
    progress: Progress | None,
) -> None:
    """Delete the target's crawl (``replace``), copy, verify, give the leases back in the
    copy; on any failure, delete what was restored."""
    assert result.before is not None
    before, stats = result.before, _stats(src)
    if existing:
        _delete(target, existing, "deleting the target's crawl (--replace)")
    copied: list[_Copied] = []
    try:
        for start in range(0, len(todo), batch):
            _dump_restore(src.client, target, todo[start : start + batch], copied, result)
            lock.renew()
            if progress is not None:
                progress("copying", min(start + batch, len(todo)), len(todo))
        dst = open_frontier(target, settings, src.crawl, follow_layout=True)
        _verify(src, dst, copied, before, stats, progress)
        if before.in_flight or result.live_workers:
            result.after = _give_back(dst, before, result)
        else:
            result.after = before
    except BaseException:
        _delete(target, (c.key for c in copied), "removing the partial copy")
        raise
    result.copied = [c.key for c in copied]
    result.stats = stats
    with redis_errors("adding the crawl to the target's registry"):
        target.sadd(crawl_registry(src.keys.prefix), src.crawl)


def _delete_source(src: FrontierCore, result: CopyResult, progress: Progress | None) -> None:
    """Delete the copied keys from the source, if it is still as it was copied."""
    if src.counts() != result.before or _stats(src) != result.stats:
        result.warnings.append("the source changed after it was copied: it was not deleted")
        return
    if progress is not None:
        progress("deleting source", 0, len(result.copied))
    _delete(src.client, result.copied, "deleting the source crawl")
    result.source_deleted = True
