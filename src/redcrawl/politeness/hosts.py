"""Operators see and steer fleet-wide politeness, live: the one library entry point the
HTTP API (``/v1/crawls/{crawl}/hosts``) and the CLI (``redcrawl hosts``) both call.

:class:`Hosts` (one crawl's frontier) reads the politeness keys with ready work or
requests in flight (:meth:`Hosts.top`), one key's limits, state and why it is not
served right now (:meth:`Hosts.show`; many keys in one round trip:
:meth:`Hosts.show_many`), and changes the operator's override of a key
(:meth:`Hosts.set`, :meth:`Hosts.reset`). Results are typed records (:class:`HostRow`,
:class:`HostPage`, :class:`HostDetail`); bad values raise :class:`BadHostInput` naming
the field, a crawl without politeness :class:`PolitenessOff`.

Cost: every call is bounded whatever the crawl's size (no SCAN). :meth:`Hosts.top`
reads at most :data:`LIST_KEYS_PER_TIER` keys from the head of each tier's ``open`` zset
(the keys that open first) and the keys of at most :data:`LIST_LEASED_IDS` leased
requests (one Lua step, ``lua/hosts_list.lua``); it says whether that was every key
(``complete``). A change is one Lua step (``lua/hosts_override.lua``) that merges the
operator's fields into the key's JSON override (robots.txt's ``crawl_delay`` is kept;
AutoThrottle's ``auto_delay`` is in the key's state hash, field ``ad``) and lowers the
key's score in the ``open`` zsets to now, so the next lease looks at it against its new
limits (docs/politeness.md, "Seeing and steering politeness").

A partitioned crawl (``REDCRAWL_PARTITIONS`` > 1): a key's state, queues and override
are read and changed in the partition that owns it
(:func:`~redcrawl.politeness.autothrottle.owner_keys`), where its lease step looks;
:meth:`Hosts.top` runs the list step in every partition in one pipelined round (one per
node on a cluster) and merges the keys (``complete`` when every partition's list was);
the crawl-wide switches (paused, defaults, AutoThrottle) are read from that partition's
copy (what its lease step reads), robots.txt from the anchor (the crawl's cache).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Final, Literal

from redcrawl.errors import FrontierError, RedcrawlError
from redcrawl.frontier import FrontierCore
from redcrawl.keys import CrawlKeys
from redcrawl.politeness.autothrottle import STATE_FIELD, owner_keys, state_delay
from redcrawl.politeness.key import MAX_KEY_BYTES
from redcrawl.politeness.robots import RobotsEntry
from redcrawl.scripts import BASE, Scripts
from redcrawl.transport import redis_errors

__all__ = [
    "LIST_KEYS_PER_TIER",
    "LIST_LEASED_IDS",
    "MAX_BLOCK",
    "MAX_CONCURRENCY",
    "MAX_DELAY",
    "SHOW_MANY",
    "UNSET",
    "BadHostInput",
    "HostDetail",
    "HostPage",
    "HostRow",
    "Hosts",
    "Limit",
    "PolitenessOff",
    "RobotsState",
    "Sort",
    "check_key",
]

MAX_DELAY = 86400.0
"""Longest delay an operator may set for a key: a day (seconds)."""
MAX_CONCURRENCY = 10_000
"""Most requests of one key in flight an operator may allow."""
MAX_BLOCK = 30 * 86400.0
"""Longest block: 30 days from now (seconds)."""
PAST_BLOCK = 86400.0
"""A ``block_until`` more than this long ago (seconds) is refused as a mistake (to lift a
block, remove it: ``unblock``, or ``block_until: null``)."""
LIST_KEYS_PER_TIER = 1000
"""Most keys :meth:`Hosts.top` reads from each tier's ``open`` zset (those that open
first); beyond that the list is a bounded sample (``complete`` false). A partitioned
crawl reads ``1/P`` of this (and of the two bounds below) in each partition, at least
100 keys (100 leases, 1,000 leased ids)."""
LIST_LEASES = 1000
"""Most leases :meth:`Hosts.top` reads (soonest deadline first)."""
LIST_LEASED_IDS = 10_000
"""Most leased requests :meth:`Hosts.top` reads the keys of."""
SHOW_MANY = 1000
"""Most keys :meth:`Hosts.show_many` reads in one call (one pipeline)."""
OPERATOR_FIELDS: Final = ("delay", "concurrency", "block_until", "paused")
"""The override's fields operators own; ``crawl_delay`` (robots.txt) is its producer's,
and a reset keeps it (as anything else a producer wrote there)."""
FULL = 2**52
"""The ``open`` score of a key whose slots are all taken (``OPEN_FULL`` in Lua)."""

_SOURCES = {
    "list": (BASE, "politeness/lua/hosts_list.lua"),
    "override": (BASE, "politeness/lua/hosts_override.lua"),
}

Source = Literal["default", "DOWNLOAD_SLOTS", "override", "crawl_delay", "auto_delay"]
Sort = Literal["ready", "inflight"]


class _Unset(Enum):
    UNSET = "UNSET"


UNSET: Final = _Unset.UNSET
"""A field left as it is (``None`` removes it from the override)."""


class BadHostInput(RedcrawlError, ValueError):
    """A value an operator gave cannot be used; :attr:`field` names it (``key``,
    ``delay``, ``concurrency``, ``block_until``, ``block_for``, ``cursor``...)."""

    def __init__(self, field: str, problem: str) -> None:
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")


class PolitenessOff(FrontierError):
    """The crawl has no fleet-wide politeness (it was created without it): there are no
    per-key limits to see or steer."""


@dataclass(frozen=True, slots=True)
class Limit:
    """An effective limit of a key and where it comes from."""

    value: float
    source: Source


@dataclass(frozen=True, slots=True)
class RobotsState:
    """The fleet's cached robots.txt of one origin of the key (``status`` 0: its
    download failed; ``kind`` as :attr:`RobotsEntry.kind`)."""

    origin: str
    status: int | None
    kind: str | None
    expires_at: float | None


@dataclass(frozen=True, slots=True)
class HostRow:
    """One politeness key in :meth:`Hosts.top`. Times are seconds since the epoch on the
    Redis clock; ``blocked_until`` is the later of the operator's and the adaptive block
    (429/503), None when neither is in the future."""

    key: str
    ready: int
    ready_per_tier: tuple[int, ...]
    in_flight: int
    next_allowed: float | None
    blocked_until: float | None
    paused: bool


@dataclass(frozen=True, slots=True)
class HostPage:
    """A page of :meth:`Hosts.top`: ``hosts`` sorted by ``sort`` (descending, then by
    key), ``next_cursor`` for the next page (None: last), ``scanned`` keys read and
    whether that was every key with ready work or in flight (``complete``)."""

    crawl: str
    sort: Sort
    hosts: list[HostRow]
    next_cursor: str | None
    scanned: int
    complete: bool
    server_time: float


@dataclass(frozen=True, slots=True)
class HostDetail:
    """One politeness key: its numbers, effective limits with their sources, the
    operator's override, blocks, robots.txt, and in words why it is not served now
    (``why`` None: it is open, the next lease takes it)."""

    crawl: str
    key: str
    ready: int
    ready_per_tier: tuple[int, ...]
    in_flight: int
    concurrency: Limit
    delay: Limit
    randomize_delay: bool
    next_allowed: float | None
    block_until: float | None
    block: float | None
    backoff_failures: int | None
    paused: bool
    crawl_paused: bool
    override: dict[str, Any]
    crawl_delay: float | None
    auto_delay: float | None
    robots: list[RobotsState]
    why: str | None
    server_time: float
    notes: list[str] = field(default_factory=list)


def check_key(key: Any) -> str:
    """``key`` if it can be a politeness key (a non-empty string of at most
    :data:`MAX_KEY_BYTES` UTF-8 bytes without control characters), else
    :class:`BadHostInput`."""
    if not isinstance(key, str) or not key:
        raise BadHostInput("key", "give a politeness key: a host name such as example.com")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadHostInput("key", "it is not valid text (a lone surrogate)") from None
    if size > MAX_KEY_BYTES:
        raise BadHostInput(
            "key",
            f"{size} bytes; a politeness key has at most {MAX_KEY_BYTES} (longer keys are "
            "stored shortened: copy the key as `redcrawl hosts` lists it)",
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        raise BadHostInput("key", "it has control characters; no politeness key has any")
    return key


def _number(name: str, value: Any, low: float, high: float, *, whole: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadHostInput(name, f"{value!r} is not a number")
    if not math.isfinite(value):
        raise BadHostInput(name, f"{value!r}: give a finite number")
    if whole and value != int(value):
        raise BadHostInput(name, f"{value!r}: give a whole number")
    if not low <= value <= high:
        raise BadHostInput(name, f"{value!r} is out of range: give {_num(low)} to {_num(high)}")
    return float(value)


def _num(x: float) -> str:
    return f"{int(x):,}" if x == int(x) else f"{x:g}"


def _obj(raw: Any) -> dict[str, Any] | None:
    """A stored JSON object (None: absent or unreadable, as the lease step ignores it)."""
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _pos(value: Any, low: float, high: float) -> float | None:
    """A stored limit as the lease step reads it (``pos_num`` in polite.lua)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and low <= value <= high else None


def _ms(raw: Any) -> float | None:
    try:
        return float(raw) if raw not in (None, b"", "") else None
    except (TypeError, ValueError):
        return None


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _ago(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Hosts:
    """Politeness keys of one crawl (``frontier``, opened with the crawl's own layout)."""

    def __init__(self, frontier: FrontierCore) -> None:
        if frontier.politeness is None:
            raise PolitenessOff(
                f"crawl {frontier.crawl!r} has no fleet-wide politeness (its layout is "
                f"{frontier.BACKEND} without a key mode"
                "): each worker limits itself and there are no per-host limits to see or "
                "set. A new crawl has it (REDCRAWL_POLITENESS on, the default): purge "
                "this crawl or use a new crawl name"
            )
        self.f = frontier
        self.keys = frontier.keys
        """The crawl's keys (a partitioned crawl's anchor: its switches, robots.txt)."""
        parts = getattr(frontier, "parts", None)
        self.partitions = len(parts) if isinstance(parts, list) and len(parts) > 1 else 1
        self._scripts = Scripts(frontier.client, _SOURCES)

    def key_keys(self, key: str) -> CrawlKeys:
        """The keys of the partition that owns politeness key ``key`` (the crawl's own
        for a crawl of one partition)."""
        return owner_keys(self.keys, self.partitions, key)

    def _part_keys(self) -> list[CrawlKeys]:
        if self.partitions == 1:
            return [self.keys]
        return [self.keys.part(p) for p in range(self.partitions)]

    # --- clock -----------------------------------------------------------------------
    def _now_ms(self) -> float:
        clock = self.f._clock  # the frontier's test clock, if any: the lease step's NOW
        if clock is not None:
            return float(clock())
        return self.f.server_time() * 1000

    def _now_arg(self) -> str:
        clock = self.f._clock
        return "" if clock is None else str(int(clock()))

    def _streams(self, keys: CrawlKeys) -> list[str]:
        """A streams crawl's streams (their pending entries are its leased requests), of
        the partition whose names ``keys`` are."""
        if self.f.BACKEND != "streams":
            return []
        return keys.streams(self.f.settings.shards)

    # --- reading -----------------------------------------------------------------------
    def top(self, *, limit: int = 100, sort: Sort = "ready", cursor: str | None = None) -> HostPage:
        """Keys with ready work or in flight, most ``sort`` first (ties by key), ``limit``
        per page from ``cursor`` (a previous page's ``next_cursor``). The order is made
        afresh at each call: a key whose numbers changed between two pages may move."""
        if sort not in ("ready", "inflight"):
            raise BadHostInput("sort", f"{sort!r}: give ready or inflight")
        _number("limit", limit, 1, 1000, whole=True)
        start = 0
        if cursor:
            if not (cursor.isascii() and cursor.isdigit() and len(cursor) < 10):
                raise BadHostInput("cursor", "give the next_cursor of the previous page")
            start = int(cursor)
        tiers = self.keys.tiers
        n = self.partitions  # (a partition reads its share of the bounds, not less than:)
        bounds = [
            max(LIST_KEYS_PER_TIER // n, 100),
            max(LIST_LEASES // n, 100),
            max(LIST_LEASED_IDS // n, 1000),
            tiers,
        ]
        with redis_errors("listing politeness keys"):
            pipe = self.f.client.pipeline(transaction=False)
            for pk in self._part_keys():  # (one round: one per node on a cluster)
                opens = (pk.open(t) for t in range(tiers))
                self._scripts["list"](
                    keys=[pk.inflight, pk.leases, pk.req, *opens, *self._streams(pk)],
                    args=bounds,
                    client=pipe,
                )
            lists = pipe.execute()
        complete = all(bool(int(found[0])) for found in lists)
        names = list(dict.fromkeys(_text(x) for found in lists for x in found[1:]))
        # their numbers: short commands, pipelined (never one long script)
        width = tiers + 2
        replies: list[Any] = []
        with redis_errors("reading politeness keys"):
            for at in range(0, len(names), 500):
                pipe = self.f.client.pipeline(transaction=False)
                for key in names[at : at + 500]:
                    k = self.key_keys(key)
                    for t in range(tiers):
                        q = f"{k.pol_queue_base}{t}:{key}"
                        if self.f.settings.ordering == "priority":
                            pipe.zcard(q)
                        else:
                            pipe.llen(q)
                    pipe.hmget(k.pol_state_base + key, "in", "next", "block")
                    pipe.hget(k.pol_override, key)
                replies += pipe.execute()
        now = self._now_ms()
        rows = []
        for i, key in enumerate(names):
            at = i * width
            per_tier = tuple(int(x) for x in replies[at : at + tiers])
            (inn_raw, nxt, block), ov = replies[at + tiers : at + width]
            override = _obj(ov) or {}
            inn = max(int(_ms(inn_raw) or 0), 0)
            blocks = [
                b
                for b in (_pos(override.get("block_until"), 0, 1e15), _ms(block))
                if b is not None and b > now
            ]
            if not sum(per_tier) and not inn:
                continue  # (a key whose last request was just settled)
            nxt_ms = _ms(nxt)
            rows.append(
                HostRow(
                    key=key,
                    ready=sum(per_tier),
                    ready_per_tier=per_tier,
                    in_flight=inn,
                    next_allowed=nxt_ms / 1000 if nxt_ms is not None else None,
                    blocked_until=max(blocks) / 1000 if blocks else None,
                    paused=override.get("paused") is True,
                )
            )
        if sort == "ready":
            rows.sort(key=lambda r: (-r.ready, -r.in_flight, r.key))
        else:
            rows.sort(key=lambda r: (-r.in_flight, -r.ready, r.key))
        page = rows[start : start + limit]
        more = start + limit < len(rows)
        return HostPage(
            crawl=self.f.crawl,
            sort=sort,
            hosts=page,
            next_cursor=str(start + limit) if more else None,
            scanned=len(names),
            complete=complete,
            server_time=now / 1000,
        )

    def show(self, key: str) -> HostDetail:
        """Everything about one key (a few reads in one round trip)."""
        return self._read([check_key(key)])[0]

    def show_many(self, keys: Sequence[str]) -> dict[str, HostDetail]:
        """:meth:`show` of each of ``keys``, all read in one pipelined round trip (the
        dashboard's, ``redcrawl top``'s hosts panel): key -> detail, in the order given.
        Keys :func:`check_key` refuses (no stored key can be one) are left out; at most
        :data:`SHOW_MANY` keys (else :class:`BadHostInput`)."""
        if len(keys) > SHOW_MANY:
            raise BadHostInput("keys", f"{len(keys):,} keys; read at most {SHOW_MANY:,} at once")
        good = []
        for key in dict.fromkeys(keys):
            try:
                good.append(check_key(key))
            except BadHostInput:
                continue
        return {d.key: d for d in self._read(good)} if good else {}

    def _read(self, keys: Sequence[str]) -> list[HostDetail]:
        """The details of ``keys`` (checked already): one pipeline, one round trip."""
        k = self.keys
        priority = self.f.settings.ordering == "priority"
        origins = [self._origins(key) for key in keys]
        with redis_errors("reading a politeness key"):
            pipe = self.f.client.pipeline(transaction=False)
            pipe.time()
            pipe.hmget(k.control, "politeness", "paused", "autothrottle")
            for key, its in zip(keys, origins, strict=True):
                pk = self.key_keys(key)  # its state; robots.txt is the crawl's (k)
                if self.partitions > 1:  # the switches as its partition's lease step reads them
                    pipe.hmget(pk.control, "politeness", "paused", "autothrottle")
                pipe.hget(pk.pol_slots, key)
                pipe.hget(pk.pol_override, key)
                pipe.hmget(pk.pol_state_base + key, "in", "next", "block", "fail", STATE_FIELD)
                for t in range(k.tiers):
                    q = f"{pk.pol_queue_base}{t}:{key}"
                    if priority:
                        pipe.zcard(q)
                    else:
                        pipe.llen(q)
                for origin in its:
                    pipe.hget(k.robots, origin)
                    pipe.zscore(k.robots_expiry, origin)
            res = pipe.execute()
        (sec, usec), control = res[:2]
        clock = self.f._clock
        now = float(clock()) if clock is not None else int(sec) * 1000 + int(usec) / 1000
        out, at = [], 2
        for key, its in zip(keys, origins, strict=True):
            own = control
            if self.partitions > 1:
                own, at = res[at], at + 1
            width = 3 + k.tiers + 2 * len(its)
            out.append(self._detail(key, now, own, res[at : at + width], its))
            at += width
        return out

    def _detail(
        self, key: str, now: float, control: Any, res: Sequence[Any], origins: list[str]
    ) -> HostDetail:
        """One key's :class:`HostDetail` from its replies in :meth:`_read`'s pipeline."""
        k = self.keys
        defaults_raw, crawl_paused, at_raw = control
        slot_raw, ov_raw, state = res[:3]
        per_tier = tuple(int(x) for x in res[3 : 3 + k.tiers])
        robots_raw = res[3 + k.tiers :]
        override = _obj(ov_raw) or {}
        notes = []
        if ov_raw and not _obj(ov_raw):
            notes.append("the stored override is not a JSON object: the lease step ignores it")
        auto_delay = state_delay(state[4])
        conc, delay, randomize = _limits(
            _obj(defaults_raw), defaults_raw, _obj(slot_raw), override, _obj(at_raw), auto_delay
        )
        inn = max(int(_ms(state[0]) or 0), 0)
        nxt = _ms(state[1])
        block = _ms(state[2])
        fails = _ms(state[3])
        block_until = _pos(override.get("block_until"), 0, 1e15)
        paused = override.get("paused") is True
        robots = []
        for i, origin in enumerate(origins):
            entry_raw, expires = robots_raw[2 * i], robots_raw[2 * i + 1]
            if entry_raw is None:
                continue
            entry = RobotsEntry.decode(entry_raw)
            robots.append(
                RobotsState(
                    origin=origin,
                    status=entry.status if entry else None,
                    kind=entry.kind if entry else None,
                    expires_at=float(expires) / 1000 if expires is not None else None,
                )
            )
        detail = HostDetail(
            crawl=self.f.crawl,
            key=key,
            ready=sum(per_tier),
            ready_per_tier=per_tier,
            in_flight=inn,
            concurrency=conc,
            delay=delay,
            randomize_delay=randomize,
            next_allowed=nxt / 1000 if nxt is not None else None,
            block_until=block_until / 1000 if block_until is not None else None,
            block=block / 1000 if block is not None else None,
            backoff_failures=int(fails) if fails is not None else None,
            paused=paused,
            crawl_paused=crawl_paused == b"1",
            override=_operator_fields(override),
            crawl_delay=_pos(override.get("crawl_delay"), 0, 1e9),
            auto_delay=auto_delay if _obj(at_raw) else None,
            robots=robots,
            why=None,
            server_time=now / 1000,
            notes=notes,
        )
        return _with_why(detail, now)

    def _origins(self, key: str) -> list[str]:
        """The robots.txt origins of a host key (http and https, default ports)."""
        host = f"[{key}]" if ":" in key else key
        return [f"https://{host}", f"http://{host}"]

    # --- changing ---------------------------------------------------------------------
    def set(
        self,
        key: str,
        *,
        delay: float | _Unset | None = UNSET,
        concurrency: int | _Unset | None = UNSET,
        block_until: float | _Unset | None = UNSET,
        block_for: float | _Unset = UNSET,
        paused: bool | _Unset | None = UNSET,
    ) -> HostDetail:
        """Change the operator's override of ``key``: a value sets the field, None
        removes it, UNSET leaves it. ``block_until`` is seconds since the epoch (Redis
        clock), ``block_for`` seconds from now (give one of them). Takes effect at the
        next lease (the key is looked at again against its new limits)."""
        key = check_key(key)
        fields: dict[str, Any] = {}
        remove: list[str] = []
        if delay is not UNSET:
            if delay is None:
                remove.append("delay")
            else:
                fields["delay"] = _number("delay", delay, 0, MAX_DELAY)
        if concurrency is not UNSET:
            if concurrency is None:
                remove.append("concurrency")
            else:
                fields["concurrency"] = int(
                    _number("concurrency", concurrency, 1, MAX_CONCURRENCY, whole=True)
                )
        if block_until is not UNSET and block_for is not UNSET:
            raise BadHostInput("block_for", "give block_until or block_for, not both")
        now = self._now_ms()
        if block_until is not UNSET:
            if block_until is None:
                remove.append("block_until")
            else:
                _number("block_until", block_until, 0, math.inf)
                at = float(block_until)
                if at * 1000 < now - PAST_BLOCK * 1000 or at * 1000 > now + MAX_BLOCK * 1000:
                    raise BadHostInput(
                        "block_until",
                        f"{at!r} is not within a day before and 30 days after the server's "
                        f"time {now / 1000:.0f} (seconds since the epoch, not ms); to lift "
                        "a block remove it (null, or `redcrawl hosts unblock`)",
                    )
                fields["block_until"] = int(at * 1000)
        block_ms = ""
        if block_for is not UNSET:
            block_ms = str(int(_number("block_for", block_for, 0.001, MAX_BLOCK) * 1000))
        if paused is not UNSET:
            if paused is None or paused is False:
                remove.append("paused")
            elif paused is True:
                fields["paused"] = True
            else:
                raise BadHostInput("paused", f"{paused!r}: give true or false")
        new_delay = fields.get("delay")
        if new_delay is None and "delay" in remove:
            # the key falls back to its configured delay (or robots.txt's, AutoThrottle's)
            new_delay = self._delay_without_operator(key)
        self._change(key, "set", fields, remove, block_ms, new_delay, now)
        return self.show(key)

    def reset(self, key: str) -> HostDetail:
        """Drop the operator's override of ``key`` (delay, concurrency, block_until,
        paused); robots.txt's ``crawl_delay`` stays (AutoThrottle's delay is elsewhere,
        in the key's state)."""
        key = check_key(key)
        self._change(key, "reset", {}, [], "", self._delay_without_operator(key), self._now_ms())
        return self.show(key)

    def _delay_without_operator(self, key: str) -> float:
        """The key's delay once the operator's own delay is gone (seconds)."""
        pk = self.key_keys(key)
        with redis_errors("reading a politeness key"):
            pipe = self.f.client.pipeline(transaction=False)
            pipe.hmget(pk.control, "politeness", "autothrottle")
            pipe.hget(pk.pol_slots, key)
            pipe.hget(pk.pol_override, key)
            pipe.hget(pk.pol_state_base + key, STATE_FIELD)
            (d, at), slot, ov, ad = pipe.execute()
        override = {f: v for f, v in (_obj(ov) or {}).items() if f != "delay"}
        return _limits(_obj(d), d, _obj(slot), override, _obj(at), state_delay(ad))[1].value

    def _change(
        self,
        key: str,
        mode: str,
        fields: Mapping[str, Any],
        remove: list[str],
        block_ms: str,
        delay: float | None,
        now: float,
    ) -> None:
        k = self.key_keys(key)
        self._scripts.run(
            "override",
            [k.pol_override, k.pol_state_base, *(k.open(t) for t in range(k.tiers))],
            [
                key,
                mode,
                json.dumps(fields),
                ",".join(remove),
                block_ms,
                "" if delay is None else str(int(delay * 1000)),
                self._now_arg(),
            ],
            what="changing a politeness override",
        )


def _limits(
    defaults: dict[str, Any] | None,
    defaults_raw: Any,
    slot: dict[str, Any] | None,
    override: Mapping[str, Any],
    autothrottle: dict[str, Any] | None = None,
    auto_delay: float | None = None,
) -> tuple[Limit, Limit, bool]:
    """(concurrency, delay, jitter) of a key as the lease step computes them
    (``limits`` in frontier/lua/polite.lua), with the source of each. While
    AutoThrottle is on (``autothrottle``: the control hash's JSON), the key's delay is at
    least its ``auto_delay`` (its state's ``ad``), else AutoThrottle's start delay."""
    d = defaults or {}
    conc = Limit(_pos(d.get("concurrency"), 1, 1e9) or (1 if defaults_raw else 8), "default")
    delay = Limit(_pos(d.get("delay"), 0, 1e9) or 0.0, "default")
    jitter = d.get("randomize") is True
    if slot:
        c = _pos(slot.get("concurrency"), 1, 1e9)
        if c is not None:
            conc = Limit(c, "DOWNLOAD_SLOTS")
        dl = _pos(slot.get("delay"), 0, 1e9)
        if dl is not None:
            delay = Limit(dl, "DOWNLOAD_SLOTS")
        if isinstance(slot.get("randomize_delay"), bool):
            jitter = slot["randomize_delay"]
    if autothrottle is not None:
        auto = _pos(auto_delay, 0, 1e9)
        if auto is None:
            auto = _pos(autothrottle.get("start_delay"), 0, 1e9) or 0.0
        if auto > delay.value:
            delay = Limit(auto, "auto_delay")
    crawl_delay = _pos(override.get("crawl_delay"), 0, 1e9)
    if crawl_delay is not None and crawl_delay > delay.value:
        delay = Limit(crawl_delay, "crawl_delay")
    v = _pos(override.get("delay"), 0, 1e9)
    if v is not None:
        delay = Limit(v, "override")
    c = _pos(override.get("concurrency"), 1, 1e9)
    if c is not None:
        conc = Limit(c, "override")
    return Limit(math.floor(conc.value), conc.source), delay, jitter


def _operator_fields(override: Mapping[str, Any]) -> dict[str, Any]:
    """The operator's fields of an override, ``block_until`` in seconds (stored in ms)."""
    out = {f: override[f] for f in OPERATOR_FIELDS if f in override}
    if isinstance(out.get("block_until"), int | float) and not isinstance(out["block_until"], bool):
        out["block_until"] = out["block_until"] / 1000
    return out


def _with_why(d: HostDetail, now: float) -> HostDetail:
    """``d`` with ``why``: the first reason, in the lease step's order, that keeps the key
    from being granted now."""
    from dataclasses import replace

    def until(at: float) -> str:
        clock = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")
        return f"until {clock} UTC (in {_ago(at - now / 1000)})"

    why: str | None = None
    t = now / 1000
    if d.crawl_paused:
        why = "the whole crawl is paused (redcrawl resume, or POST .../resume)"
    elif d.ready == 0:
        why = "no ready requests" + (f" ({d.in_flight} in flight)" if d.in_flight else "")
    elif d.paused:
        why = "paused by operator (redcrawl hosts set KEY --resume)"
    elif d.block_until is not None and d.block_until > t and (d.block or 0) <= d.block_until:
        why = f"blocked by operator {until(d.block_until)}"
    elif d.block is not None and d.block > t:
        fails = f", {d.backoff_failures} failure(s) in a row" if d.backoff_failures else ""
        why = f"blocked after 429/503 responses{fails} {until(d.block)}"
    elif d.in_flight >= d.concurrency.value:
        n = int(d.concurrency.value)
        why = f"all {n} slots in flight" if n != 1 else "its only slot is in flight"
    elif d.next_allowed is not None and d.next_allowed > t:
        why = f"delay: next fetch allowed in {d.next_allowed - t:.1f} s"
    return replace(d, why=why)
