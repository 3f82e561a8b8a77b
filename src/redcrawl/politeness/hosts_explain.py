"""Explaining a politeness key as its lease step sees it (part of
:mod:`redcrawl.politeness.hosts`): stored values read as ``frontier/lua/polite.lua`` reads
them, the effective limits with their sources (:func:`_limits`), a key's
:class:`HostDetail` from the replies of one pipelined read (:func:`_detail`) and, in
words, why it is not served now (:func:`_with_why`)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from redcrawl.politeness.autothrottle import state_delay
from redcrawl.politeness.hosts_records import OPERATOR_FIELDS, HostDetail, Limit, RobotsState
from redcrawl.politeness.robots import RobotsEntry


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


def _detail(
    crawl: str,
    tiers: int,
    key: str,
    now: float,
    control: Any,
    res: Sequence[Any],
    origins: list[str],
) -> HostDetail:
    """One key's :class:`HostDetail` (of ``crawl``, with ``tiers`` tiers) from its
    replies in :meth:`Hosts._read`'s pipeline."""
    defaults_raw, crawl_paused, at_raw = control
    slot_raw, ov_raw, state = res[:3]
    per_tier = tuple(int(x) for x in res[3 : 3 + tiers])
    robots_raw = res[3 + tiers :]
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
    if sum(per_tier) == 0 and not any(v is not None for v in state[:4]) and not robots:
        port = re.fullmatch(r"[^:\[\]]+:\d+", key) is not None
        notes.append(
            "no request of the crawl has this key now (nothing ready or in flight, no state)"
            + (": keys are host names without their port" if port else "")
            + "; an override set here applies when requests with this key come"
        )
    detail = HostDetail(
        crawl=crawl,
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
