"""The streams backend: ready and leased requests as entries of Redis Streams, sharded by
the URL's host, with one consumer group per crawl and one consumer per worker.

The streams backend's queue layer (``lua/queue_streams.lua``); the request records,
dedupe, DELAYED and DEAD sets, counters and heartbeats are
:class:`~redcrawl.frontier.core.FrontierCore`'s, shared with the lists backend:

- a request goes to shard ``shard_of(url)`` (a hash of its host), into the shard's high
  stream if its priority is at least the first tier bound (``REDCRAWL_TIER_BOUNDS``,
  default 1), else into its low stream; ``lease`` reads high streams first;
- a lease is a pending entry of the group (its delivery count is the request's attempts);
  an entry idle for the lease ttl whose worker's heartbeat has stopped is claimed by the
  next ``lease`` (XPENDING IDLE + XCLAIM), and dead-lettered once ``max_attempts``
  deliveries are used up;
- an entry is deleted (XACK + XDEL) as soon as its request leaves IN-FLIGHT; streams are
  never trimmed, so nothing unacked is ever lost.

See docs/streams.md.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis.exceptions

from redcrawl.codec import Envelope
from redcrawl.frontier.base import format_id, parse_id
from redcrawl.frontier.core import FrontierCore, Held, consistent_read
from redcrawl.frontier.records import stored_int
from redcrawl.transport import redis_errors

__all__ = ["GROUP", "PendingEntry", "ShardInfo", "StreamsFrontier", "host_of", "shard_of"]

log = logging.getLogger(__name__)

GROUP = "g"
"""The consumer group of every stream of a crawl."""
CLOCK_OFFSET = 10**12
"""S_K of ``lua/queue_streams.lua``: with a caller's clock, idle times are backdated by it."""

_SCHEME = re.compile(rb"^[A-Za-z][A-Za-z0-9+.\-]*://(.*)$", re.DOTALL)
_AUTH = re.compile(rb"^[^/?#]*")
_V6 = re.compile(rb"^\[[^\]]*\]?")


def host_of(url: str) -> bytes:
    """The lower-cased host of ``url`` (userinfo and port dropped), as bytes — exactly as
    ``host_of`` in ``lua/queue_streams.lua`` computes it, which shards requests coming
    back from DELAYED or DEAD."""
    raw = url.encode("utf-8", "surrogatepass")
    m = _SCHEME.match(raw)
    rest = m.group(1) if m else raw
    auth = _AUTH.match(rest)
    host = (auth.group(0) if auth else b"").rsplit(b"@", 1)[-1]
    if host.startswith(b"["):
        v6 = _V6.match(host)
        host = v6.group(0) if v6 else host
    else:
        host = host.split(b":", 1)[0]
    return host.lower()


def shard_of(url: str, shards: int) -> int:
    """The shard of a URL: the first 32 bits of SHA-1(host) modulo ``shards``, so every
    request of a host lands in the same shard."""
    return int(hashlib.sha1(host_of(url)).hexdigest()[:8], 16) % shards


@dataclass(frozen=True, slots=True)
class PendingEntry:
    """A pending (leased) entry of a stream."""

    entry: str
    """The stream entry id."""
    id: str
    """The request id (see :func:`~redcrawl.frontier.base.format_id`); "?" if the entry is
    gone."""
    consumer: str
    """The worker holding it."""
    idle: float
    """Seconds since it was delivered or last extended (the frontier's clock)."""
    since: float
    """When that was (seconds since the epoch, the frontier's clock)."""
    deliveries: int
    """Its delivery count: the request's attempts, this one included."""


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """One stream of a shard (see :meth:`StreamsFrontier.shards`)."""

    shard: int
    stream: Literal["high", "low"]
    key: str
    length: int
    """Entries in the stream: ready + pending."""
    pending: int
    """Entries delivered and not yet acknowledged (in flight)."""
    consumers: int
    """Consumers (workers) known to the group of this stream."""
    entries: list[PendingEntry]
    """Pending entries, oldest entry first (at most the ``limit`` asked for)."""

    @property
    def ready(self) -> int:
        return self.length - self.pending


class StreamsFrontier(FrontierCore):
    """A crawl frontier on Redis Streams (``REDCRAWL_BACKEND=streams``; Redis 6.2+). See
    :class:`~redcrawl.frontier.core.FrontierCore` for its operations.

    ``clock``, if given, returns the time in milliseconds used instead of the server's
    clock (tests); stream idle times are then backdated to follow it (see
    ``lua/queue_streams.lua``).
    """

    BACKEND = "streams"
    STANDALONE = {"counts": ("frontier/lua/counts_streams.lua",)}

    # --- the queue layer (see redcrawl.frontier.core) ------------------------------
    def _politeness_mode(self) -> str | None:
        return self._stored_politeness_mode(f"streams/{self.settings.shards}")

    def _script_keys(self) -> list[str]:
        keys = self.keys.script_keys(self.settings.shards)
        if self.politeness is not None:
            keys += self.keys.politeness_script_keys()
        return keys

    def _layout(self) -> str:
        if self.politeness is not None:
            return f"streams/{self.settings.shards}/{self.politeness}"
        return f"streams/{self.settings.shards}"

    def _push_extra(self, envelopes: Sequence[Envelope]) -> list[tuple[int]]:
        shards = self.settings.shards
        return [(shard_of(env.url, shards),) for env in envelopes]

    def _count_call(self) -> tuple[list[str], list[Any]]:
        k = self.keys
        return [k.stats, k.delayed, k.dead, *self.stream_keys()], []

    def _count_states(self) -> tuple[Sequence[Any], int, int, int]:
        """In flight = entries pending in the group, ready = the other entries (and, with
        politeness, the requests in the per-key queues: stats ``ready``)."""
        k = self.keys
        res = self._scripts.run("counts", *self._count_call())
        ready, delayed, dead = (int(x) for x in res[7:10])
        if self.politeness is not None:
            queued = stored_int(res[10])
            if queued is None:  # corrupt: recounted by any script, e.g. repair
                self.repair()
                queued = stored_int(self.client.hget(k.stats, "ready"))
            ready += max(queued or 0, 0)
        return res[:7], ready, delayed, dead

    def _ready_ids(self, limit: int) -> Iterator[tuple[int, list[bytes]]]:
        """Entries not yet delivered, high streams (tier 0) first, then low (tier 1); with
        politeness, first the per-key queues (key by key, in the order the keys open)."""
        if self.politeness is not None:
            yield from self._pol_ready_ids(limit, "fifo")
        for _s, cls, key in self._stream_rows():
            start = "-"
            try:
                for g in self.client.xinfo_groups(key):
                    if g["name"] in (GROUP, GROUP.encode()):
                        last = g["last-delivered-id"]
                        start = "(" + (last.decode() if isinstance(last, bytes) else last)
            except redis.exceptions.ResponseError:
                continue  # no such stream
            entries = self.client.xrange(key, start, "+", count=limit)
            yield (0 if cls == "high" else 1), [fields[b"r"] for _eid, fields in entries]

    def _held(self, limit: int) -> Iterator[list[Held]]:
        """Pending entries, oldest first: since their delivery or last extension, until
        that + the lease ttl."""
        ttl = self.settings.lease_ttl
        yield [
            Held(parse_id(e.id), e.consumer, e.since, e.since + ttl, _ends_with("/" + e.entry))
            for info in self.shards(limit)
            for e in info.entries
            if e.id != "?"
        ]

    def _holder(self, token: str) -> str | None:
        """The consumer the token's entry is pending with (the token names it)."""
        parts = token.split("/", 2)
        keys = self.stream_keys()
        if len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) >= len(keys):
            return None
        rows = self.client.xpending_range(keys[int(parts[1])], GROUP, parts[2], parts[2], 1)
        return rows[0]["consumer"].decode() if rows else None

    def _purge_extra(self) -> None:
        self._purge_politeness()

    def _extra_keys(self) -> list[str]:
        found = {
            k.decode() for k in self.client.scan_iter(match=self.keys.stream_pattern(), count=1000)
        }
        return sorted(found | set(self.stream_keys()))

    def _forget_consumers(self, worker: str) -> None:
        """Its consumers that have nothing pending are removed from the group."""
        keys = self.stream_keys()
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.xpending_range(key, GROUP, "-", "+", 1, consumername=worker)
        res = pipe.execute(raise_on_error=False)
        pipe = self.client.pipeline(transaction=False)
        for key, held in zip(keys, res, strict=True):
            if isinstance(held, list) and not held:
                pipe.xgroup_delconsumer(key, GROUP, worker)
        pipe.execute(raise_on_error=False)

    # --- streams only --------------------------------------------------------------
    def stream_keys(self) -> list[str]:
        """The crawl's streams: shard 0 high, shard 0 low, shard 1 high, ..."""
        return self.keys.streams(self.settings.shards)

    def _offset(self) -> int:
        """How far idle times are backdated (0 with the server clock)."""
        return 0 if self._clock is None else CLOCK_OFFSET

    def _now_ms(self, server_ms: int) -> int:
        return server_ms if self._clock is None else int(self._clock())

    def _stream_rows(self) -> list[tuple[int, Literal["high", "low"], str]]:
        """(shard, "high"/"low", key) of every stream, high streams first."""
        rows: list[tuple[int, Literal["high", "low"], str]] = []
        for high in (True, False):
            for s in range(self.settings.shards):
                rows.append((s, "high" if high else "low", self.keys.stream(s, high)))
        return rows

    def shards(self, limit: int = 100) -> list[ShardInfo]:
        """Per shard and stream: length, pending count, consumers, and up to ``limit``
        pending entries each (which request, which consumer, idle time, delivery count).
        Streams that were never written are left out."""
        rows = self._stream_rows()
        with redis_errors("shards"):

            def queue(pipe: Any) -> None:
                pipe.time()
                for _s, _c, key in rows:
                    pipe.xlen(key)
                    pipe.xpending(key, GROUP)
                    pipe.xpending_range(key, GROUP, "-", "+", limit)
                    pipe.xinfo_consumers(key, GROUP)

            res = consistent_read(self.client, queue, raise_on_error=False)
            sec, usec = res[0]
            server_ms = int(sec) * 1000 + int(usec) // 1000
            now_ms = self._now_ms(server_ms)
            found: list[tuple[int, Literal["high", "low"], str, int, int, int, list[Any]]] = []
            for i, (s, cls, key) in enumerate(rows):
                length, summary, entries, consumers = res[1 + 4 * i : 5 + 4 * i]
                if not isinstance(length, int) or (length == 0 and not isinstance(summary, dict)):
                    continue
                if not isinstance(summary, dict):
                    summary, entries, consumers = {"pending": 0}, [], []
                found.append(
                    (s, cls, key, length, int(summary["pending"]), len(consumers), entries)
                )
            rids = self._entry_ids([(f[2], e["message_id"]) for f in found for e in f[6]])
        out: list[ShardInfo] = []
        at = 0
        for s, cls, key, length, pending, consumers, entries in found:
            mine = rids[at : at + len(entries)]
            at += len(entries)
            out.append(
                ShardInfo(
                    shard=s,
                    stream=cls,
                    key=key,
                    length=length,
                    pending=pending,
                    consumers=consumers,
                    entries=[
                        self._entry(e, rid, server_ms, now_ms)
                        for e, rid in zip(entries, mine, strict=True)
                    ],
                )
            )
        return out

    def _entry(
        self, e: dict[str, Any], rid: bytes | None, server_ms: int, now_ms: int
    ) -> PendingEntry:
        # delivered or last extended at server_ms - idle, backdated by the clock offset
        since = server_ms - int(e["time_since_delivered"]) + self._offset()
        return PendingEntry(
            entry=e["message_id"].decode(),
            id=format_id(rid) if rid is not None else "?",
            consumer=e["consumer"].decode(),
            idle=(now_ms - since) / 1000,
            since=since / 1000,
            deliveries=int(e["times_delivered"]),
        )

    def _entry_ids(self, entries: Sequence[tuple[str, bytes]]) -> list[bytes | None]:
        """The request id of each (stream, entry id) (None if the entry is gone), in one
        round trip."""
        if not entries:
            return []
        pipe = self.client.pipeline(transaction=False)
        for key, eid in entries:
            pipe.xrange(key, eid, eid)
        out: list[bytes | None] = []
        for r in pipe.execute():
            out.append(r[0][1].get(b"r") if r else None)
        return out


def _ends_with(suffix: str) -> Callable[[str], bool]:
    return lambda token: token.endswith(suffix)
