"""Operators see and steer fleet-wide politeness, live: the one library entry point the
HTTP API (``/v1/crawls/{crawl}/hosts``) and the CLI (``redcrawl hosts``) both call.

:class:`Hosts` (one crawl's frontier) reads the politeness keys with ready work or
requests in flight (:meth:`Hosts.top`), one key's limits, state and why it is not
served right now (:meth:`Hosts.show`; many keys in one round trip:
:meth:`Hosts.show_many`), and changes the operator's override of a key
(:meth:`Hosts.set`, :meth:`Hosts.reset`). Results are typed records (:class:`HostRow`,
:class:`HostPage`, :class:`HostDetail`); bad values raise :class:`BadHostInput` naming
the field, a crawl without politeness :class:`PolitenessOff` (all in
:mod:`~redcrawl.politeness.hosts_records`, re-exported here). How a key's effective limits
and the reason it waits are worked out from what is stored is
:mod:`~redcrawl.politeness.hosts_explain`.

Cost: every call is bounded whatever the crawl's size (no SCAN). :meth:`Hosts.top`
reads at most :data:`LIST_KEYS_PER_TIER` keys from the head of each tier's ``open`` zset
(the keys that open first) and the keys of at most :data:`LIST_LEASED_IDS` leased
requests (``lua/hosts_list.lua``, in steps of at most :data:`LIST_STEP_IDS` records each,
so no step holds Redis for long); it says whether that was every key
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
from typing import Any

from redcrawl.frontier import FrontierCore
from redcrawl.keys import CrawlKeys
from redcrawl.politeness.autothrottle import STATE_FIELD, owner_keys, state_delay
from redcrawl.politeness.hosts_explain import _detail, _limits, _ms, _obj, _pos, _text
from redcrawl.politeness.hosts_records import (
    LIST_KEYS_PER_TIER,
    LIST_LEASED_IDS,
    LIST_LEASES,
    LIST_STEP_IDS,
    MAX_BLOCK,
    MAX_CONCURRENCY,
    MAX_DELAY,
    PAST_BLOCK,
    SHOW_MANY,
    UNSET,
    BadHostInput,
    HostDetail,
    HostPage,
    HostRow,
    Limit,
    PolitenessOff,
    RobotsState,
    Sort,
    _number,
    _Unset,
    check_block_for,
    check_concurrency,
    check_delay,
    check_key,
)
from redcrawl.scripts import BASE, Scripts
from redcrawl.transport import redis_errors

__all__ = [
    "LIST_KEYS_PER_TIER",
    "LIST_LEASED_IDS",
    "LIST_STEP_IDS",
    "MAX_BLOCK",
    "MAX_CONCURRENCY",
    "MAX_DELAY",
    "PAST_BLOCK",
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

_SOURCES = {
    "list": (BASE, "politeness/lua/hosts_list.lua"),
    "override": (BASE, "politeness/lua/hosts_override.lua"),
}


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
        names, complete = self._listed(tiers)
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

    def _listed(self, tiers: int) -> tuple[list[str], bool]:
        """The keys with ready work (the heads of the open zsets) or in flight (the
        leased requests' records), each once, and whether that was every one."""
        n = self.partitions  # (a partition reads its share of the bounds, not less than:)
        head = max(LIST_KEYS_PER_TIER // n, 100)
        leases, total = max(LIST_LEASES // n, 100), max(LIST_LEASED_IDS // n, 1000)
        parts = self._part_keys()
        # one step per partition at first (one round: one per node on a cluster), then
        # as many more as the leased requests need, LIST_STEP_IDS records per step
        cursors: dict[int, str] = {i: "" for i in range(len(parts))}
        read = dict.fromkeys(cursors, 0)
        complete, found = True, []
        first = True
        while cursors:
            with redis_errors("listing politeness keys"):
                pipe = self.f.client.pipeline(transaction=False)
                for i, cursor in cursors.items():
                    pk = parts[i]
                    opens = (pk.open(t) for t in range(tiers))
                    step = min(LIST_STEP_IDS, total - read[i])
                    self._scripts["list"](
                        keys=[pk.inflight, pk.leases, pk.req, *opens, *self._streams(pk)],
                        args=[head if first else 0, leases, step, tiers, cursor],
                        client=pipe,
                    )
                replies = pipe.execute()
            first = False
            going: dict[int, str] = {}
            for (i, _), reply in zip(cursors.items(), replies, strict=True):
                cut, cursor = bool(int(reply[0])), _text(reply[1])
                complete = complete and not cut
                found += reply[2:]
                read[i] += LIST_STEP_IDS
                if cursor:
                    if read[i] >= total:
                        complete = False  # (more leased requests than this reads)
                    else:
                        going[i] = cursor
            cursors = going
        names = list(dict.fromkeys(_text(x) for x in found))
        return names, complete

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
            out.append(_detail(self.f.crawl, k.tiers, key, now, own, res[at : at + width], its))
            at += width
        return out

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
                fields["delay"] = check_delay(delay)
        if concurrency is not UNSET:
            if concurrency is None:
                remove.append("concurrency")
            else:
                fields["concurrency"] = check_concurrency(concurrency)
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
            block_ms = str(int(check_block_for(block_for) * 1000))
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
