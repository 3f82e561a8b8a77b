"""The streams backend: ready and leased requests as entries of Redis Streams, sharded by
the URL's host, with one consumer group per crawl and one consumer per worker.

Same interface, same request records, same dedupe, DELAYED and DEAD sets, counters and
heartbeats as the lists backend (:class:`~redcrawl.frontier.ListsFrontier`, which this
class extends); only the ready-queue layer differs (``lua/queue_streams.lua``):

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

import dataclasses
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

import redis
import redis.exceptions

from redcrawl import codec
from redcrawl.codec import Envelope
from redcrawl.errors import DecodeError
from redcrawl.frontier.base import (
    Counts,
    InflightInfo,
    Lease,
    PendingInfo,
    RequestInfo,
    format_id,
    parse_id,
)
from redcrawl.frontier.lists import ListsFrontier, from_record, parse_record
from redcrawl.settings import Settings
from redcrawl.transport import redis_errors

__all__ = ["GROUP", "PendingEntry", "ShardInfo", "StreamsFrontier", "host_of", "shard_of"]

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


def _lua(name: str) -> str:
    return (resources.files("redcrawl.frontier") / "lua" / name).read_text("utf-8")


def _is_nogroup(x: Any) -> bool:
    return isinstance(x, redis.exceptions.ResponseError) and "NOGROUP" in str(x)


class StreamsFrontier(ListsFrontier):
    """A crawl frontier on Redis Streams (``REDCRAWL_BACKEND=streams``; Redis 6.2+).

    ``clock``, if given, returns the time in milliseconds used instead of the server's
    clock (tests); stream idle times are then backdated to follow it (see
    ``lua/queue_streams.lua``).
    """

    BACKEND = "streams"

    def __init__(
        self,
        client: redis.Redis,
        settings: Settings,
        crawl: str,
        *,
        clock: Callable[[], int] | None = None,
    ) -> None:
        if settings.backend != "streams":
            settings = settings.replace(backend="streams")  # validates the ordering
        super().__init__(client, settings, crawl, clock=clock)
        self._counts_script = client.register_script(_lua("counts_streams.lua"))

    # --- plumbing ------------------------------------------------------------------
    def _script_keys(self) -> list[str]:
        return self.keys.script_keys(self.settings.shards)

    def _layout(self) -> str:
        return f"streams/{self.settings.shards}"

    def stream_keys(self) -> list[str]:
        """The crawl's streams: shard 0 high, shard 0 low, shard 1 high, ..."""
        return self.keys.streams(self.settings.shards)

    def _push_args(self, envelopes: Sequence[Envelope]) -> list[Any]:
        args: list[Any] = []
        shards = self.settings.shards
        for env, (rec, fp, prio) in zip(envelopes, _triples(super()._push_args(envelopes)),
                                        strict=True):
            args += (rec, fp, prio, shard_of(env.url, shards))
        return args

    def _leases(self, worker: str, raw: Sequence[Any]) -> list[Lease]:
        """Lease objects from a streams lease reply (id, attempts, record, token per
        request); undecodable requests are dead-lettered."""
        leases: list[Lease] = []
        bad: list[tuple[bytes, str, str]] = []
        for i in range(0, len(raw or ()), 4):
            rid, attempts = bytes(raw[i]), int(raw[i + 1])
            data, token = bytes(raw[i + 2]), bytes(raw[i + 3]).decode()
            try:
                env = from_record(data)
            except DecodeError as exc:
                bad.append((rid, token, f"undecodable envelope: {exc}"))
                continue
            if len(rid) == 20:
                env.fingerprint = rid
            leases.append(Lease(rid, token, worker, attempts, env))
        self._dead_letter(worker, bad)
        return leases

    def _extra_keys(self) -> list[str]:
        found = {k.decode() for k in self.client.scan_iter(match=self.keys.stream_pattern(),
                                                            count=1000)}
        return sorted(found | set(self.stream_keys()))

    def _offset(self) -> int:
        """How far idle times are backdated (0 with the server clock)."""
        return 0 if self._clock is None else CLOCK_OFFSET

    def _now_ms(self, server_ms: int) -> int:
        return server_ms if self._clock is None else int(self._clock())

    def forget_worker(self, worker: str) -> None:
        """Remove a worker's heartbeat and its consumers (those with nothing pending)."""
        super().forget_worker(worker)
        keys = self.stream_keys()
        with redis_errors("forget_worker"):
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.xpending_range(key, GROUP, "-", "+", 1, consumername=worker)
            res = pipe.execute(raise_on_error=False)
            pipe = self.client.pipeline(transaction=False)
            for key, held in zip(keys, res, strict=True):
                if isinstance(held, list) and not held:
                    pipe.xgroup_delconsumer(key, GROUP, worker)
            pipe.execute(raise_on_error=False)

    # --- inspection ----------------------------------------------------------------
    def counts(self, *, repaired: bool = False) -> Counts:
        """A consistent snapshot (one script) of the conservation terms: in flight =
        entries pending in the group, ready = the other entries. A corrupt counter is
        repaired first (:meth:`repair`)."""
        k = self.keys
        with redis_errors("counts"):
            res = self._counts_script(keys=[k.stats, k.delayed, k.dead, *self.stream_keys()])
        stats = self._counters(res[:6], repaired)
        if stats is None:
            return self._repaired_counts(repaired)
        accepted, filtered, done, retried, reclaimed, requeued = stats
        ready, in_flight, delayed, dead = (int(x) for x in res[6:])
        return Counts(accepted=accepted, filtered=filtered, ready=ready, delayed=delayed,
                      in_flight=in_flight, done=done, dead=dead, retried=retried,
                      reclaimed=reclaimed, requeued=requeued)

    def _stream_rows(self) -> list[tuple[int, Literal["high", "low"], str]]:
        """(shard, "high"/"low", key) of every stream, high streams first."""
        rows: list[tuple[int, Literal["high", "low"], str]] = []
        for high in (True, False):
            for s in range(self.settings.shards):
                rows.append((s, "high" if high else "low", self.keys.stream(s, high)))
        return rows

    def pending(self, limit: int = 100) -> list[PendingInfo]:
        """Ready requests (entries not yet delivered), high streams first; ``tier`` is 0
        for high and 1 for low."""
        out: list[PendingInfo] = []
        with redis_errors("pending"):
            for _s, cls, key in self._stream_rows():
                if len(out) >= limit:
                    break
                start = "-"
                try:
                    for g in self.client.xinfo_groups(key):
                        if g["name"] in (GROUP, GROUP.encode()):
                            last = g["last-delivered-id"]
                            start = "(" + (last.decode() if isinstance(last, bytes) else last)
                except redis.exceptions.ResponseError:
                    continue  # no such stream
                entries = self.client.xrange(key, start, "+", count=limit - len(out))
                ids = [fields[b"r"] for _eid, fields in entries]
                for rid, env in zip(ids, self._envelopes(ids), strict=True):
                    out.append(PendingInfo(format_id(rid), 0 if cls == "high" else 1,
                                           env.url if env else "?", env.priority if env else 0))
        return out[:limit]

    def shards(self, limit: int = 100) -> list[ShardInfo]:
        """Per shard and stream: length, pending count, consumers, and up to ``limit``
        pending entries each (which request, which consumer, idle time, delivery count).
        Streams that were never written are left out."""
        rows = self._stream_rows()
        with redis_errors("shards"):
            pipe = self.client.pipeline(transaction=True)
            pipe.time()
            for _s, _c, key in rows:
                pipe.xlen(key)
                pipe.xpending(key, GROUP)
                pipe.xpending_range(key, GROUP, "-", "+", limit)
                pipe.xinfo_consumers(key, GROUP)
            res = pipe.execute(raise_on_error=False)
            sec, usec = res[0]
            server_ms = int(sec) * 1000 + int(usec) // 1000
            now_ms = self._now_ms(server_ms)
            found: list[tuple[int, Literal["high", "low"], str, int, int, int, list[Any]]] = []
            for i, (s, cls, key) in enumerate(rows):
                length, summary, entries, consumers = res[1 + 4 * i:5 + 4 * i]
                if not isinstance(length, int) or (length == 0 and not isinstance(summary,
                                                                                  dict)):
                    continue
                if not isinstance(summary, dict):
                    summary, entries, consumers = {"pending": 0}, [], []
                found.append((s, cls, key, length, int(summary["pending"]), len(consumers),
                              entries))
            rids = self._entry_ids([(f[2], e["message_id"]) for f in found for e in f[6]])
        out: list[ShardInfo] = []
        at = 0
        for s, cls, key, length, pending, consumers, entries in found:
            mine = rids[at:at + len(entries)]
            at += len(entries)
            out.append(ShardInfo(shard=s, stream=cls, key=key, length=length, pending=pending,
                                 consumers=consumers,
                                 entries=[self._entry(e, rid, server_ms, now_ms)
                                          for e, rid in zip(entries, mine, strict=True)]))
        return out

    def _entry(self, e: dict[str, Any], rid: bytes | None, server_ms: int,
               now_ms: int) -> PendingEntry:
        # delivered or last extended at server_ms - idle, backdated by the clock offset
        since = server_ms - int(e["time_since_delivered"]) + self._offset()
        return PendingEntry(entry=e["message_id"].decode(),
                            id=format_id(rid) if rid is not None else "?",
                            consumer=e["consumer"].decode(), idle=(now_ms - since) / 1000,
                            since=since / 1000, deliveries=int(e["times_delivered"]))

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

    def inflight(self, limit: int = 100) -> list[InflightInfo]:
        """Leased requests: which worker, since when (delivery or last extension), until
        when (that + the lease ttl), oldest entries first."""
        out: list[InflightInfo] = []
        ttl = self.settings.lease_ttl
        entries = [e for info in self.shards(limit) for e in info.entries if e.id != "?"]
        if not entries:
            return out
        with redis_errors("inflight"):
            recs = self.client.hmget(self.keys.req, [parse_id(e.id) for e in entries])
        for e, rec in zip(entries, recs, strict=True):
            if rec is None:
                continue
            try:
                _p, attempts, token, body = parse_record(rec)
                url = codec.decode(body).url
            except DecodeError:
                continue
            if not token.endswith("/" + e.entry):
                continue
            out.append(InflightInfo(e.id, e.consumer, attempts, e.since, e.since + ttl, url))
            if len(out) >= limit:
                break
        return out

    def describe(self, id: str) -> RequestInfo | None:
        info = super().describe(id)
        if info is None or info.state != "in_flight":
            return info
        with redis_errors("describe"):
            rec = self.client.hget(self.keys.req, parse_id(id))
            try:
                token = parse_record(rec)[2] if rec else ""
            except DecodeError:
                token = ""
            parts = token.split("/", 2)
            if len(parts) != 3 or not parts[1].isdigit():
                return info
            keys = self.stream_keys()
            k = int(parts[1])
            if k >= len(keys):
                return info
            rows = self.client.xpending_range(keys[k], GROUP, parts[2], parts[2], 1)
        worker = rows[0]["consumer"].decode() if rows else None
        return dataclasses.replace(info, worker=worker)


def _triples(args: list[Any]) -> list[tuple[Any, Any, Any]]:
    return [(args[i], args[i + 1], args[i + 2]) for i in range(0, len(args), 3)]
