"""The HTML of the dashboard's pages (:mod:`redcrawl.api.routes.dashboard`): the layout
and its style sheet, forms, the counts and hosts tables, and the last hour's rates as an
inline SVG line. Plain HTML, no script; every text that comes from Redis is escaped."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from html import escape
from urllib.parse import urlencode

from redcrawl.frontier import Counts
from redcrawl.keys import HISTORY_MINUTES
from redcrawl.metrics.history import Series
from redcrawl.metrics.hosts_view import HostsPanel
from redcrawl.metrics.snapshot import CrawlSnapshot

__all__ = [
    "_counts_table",
    "_form",
    "_hosts_table",
    "_layout",
    "_per_s",
    "_rates_note",
    "_spark",
    "_state",
]


def _layout(title: str, body: str, *, refresh: int, logged_in: bool) -> str:
    meta = f'<meta http-equiv=refresh content="{refresh}">' if refresh else ""
    logout = (
        (
            '<form method=post action="/logout" class=logout><button type=submit '
            "id=logout>log out</button></form>"
        )
        if logged_in
        else ""
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f'{meta}<link rel=icon href="data:,"><title>{escape(title)}</title>'
        f'<style>{_CSS}</style></head><body><header><a href="/">redcrawl</a>'
        f"{logout}</header><main>{body}</main></body></html>"
    )


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#223;padding:.5em 1em;display:flex;justify-content:space-between}
header a{color:#fff;font-weight:bold;text-decoration:none}
main{padding:1em 2em}
table{border-collapse:collapse;margin:.5em 0 1em;background:#fff}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}
td.err,td.url,td.key{max-width:30em;overflow-wrap:anywhere;font-family:monospace;font-size:12px}
small{font-weight:normal;color:#666;font-size:60%}
.flash{background:#ffd;border:1px solid #dd8;padding:.3em .6em;display:inline-block}
.note{color:#666;font-size:12px}
form{display:inline;margin:0}
button{cursor:pointer}
svg{vertical-align:middle}
"""


def _form(
    action: str, csrf: str, label: str, id_: str, fields: dict[str, str] | None = None
) -> str:
    hidden = "".join(
        f'<input type=hidden name="{escape(k)}" value="{escape(val)}">'
        for k, val in {"csrf": csrf, **(fields or {})}.items()
    )
    ident = f' id="{escape(id_)}"' if id_ else ""
    return (
        f'<form method=post action="{escape(action)}">{hidden}'
        f"<button type=submit{ident}>{escape(label)}</button></form>"
    )


def _state(c: CrawlSnapshot) -> str:
    n = c.counts
    if c.lost_partitions:
        return f"damaged: {c.lost_partitions} partition(s) lost (redcrawl status)"
    if c.paused:
        return "paused"
    if n.finished and n.accepted:
        return "finished"
    return "running" if c.workers_alive else "waiting for workers"


def _counts_table(n: Counts, stats: Mapping[str, int] | None = None) -> str:
    """The counts of a crawl; ``stats`` (its stats hash) adds the requests robots.txt
    disallowed (done without a fetch) once there are any."""
    cells = [
        ("ready", n.ready),
        ("delayed", n.delayed),
        ("in flight", n.in_flight),
        ("done", n.done),
        ("dead", n.dead),
        ("accepted", n.accepted),
        ("duplicates", n.filtered),
    ]
    ids = ["ready", "delayed", "inflight", "done", "dead", "accepted", "filtered"]
    disallowed = (stats or {}).get("robots_disallowed", 0)
    if disallowed:
        cells.append(("robots.txt disallowed", disallowed))
        ids.append("robots-disallowed")
    return (
        "<table id=counts><tr>"
        + "".join(f"<th>{name}</th>" for name, _ in cells)
        + "</tr><tr>"
        + "".join(
            f'<td class=n id="count-{i}">{value}</td>'
            for i, (_, value) in zip(ids, cells, strict=True)
        )
        + "</tr></table>"
    )


def _hosts_table(
    panel: HostsPanel, open_keys: int | None, path: str, query: Mapping[str, str]
) -> str:
    """The hosts table of a crawl's page (keys and reasons are user data: escaped)."""

    def order(sort: str, label: str) -> str:
        if panel.sort == sort:
            return f"<b>{label}</b>"
        params = {k: v for k, v in query.items() if k in ("refresh",)}
        params["hosts"] = sort
        return (
            f'<a href="{escape(path)}?{escape(urlencode(params))}" id="hosts-by-{sort}">{label}</a>'
        )

    seen = f"{len(panel.hosts):,} of {panel.scanned:,}" + ("" if panel.complete else "+")
    head = (
        f"<h2>Hosts (top {seen} by {'ready' if panel.sort == 'ready' else 'in flight'}"
        + (f"; {open_keys:,} open now" if open_keys is not None else "")
        + ")</h2>"
        f"<p class=note>order by {order('ready', 'ready')} | {order('inflight', 'in flight')}"
        " &middot; change a host's limits with <code>redcrawl hosts set</code> or "
        "<code>PUT /v1/crawls/{crawl}/hosts/{key}</code></p>"
    )
    if not panel.hosts:
        return head + "<p id=hosts-empty>No host with ready work or in flight.</p>"
    rows = []
    for h in panel.hosts:
        blocked = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(h.blocked_until))
            if h.blocked_until is not None
            else ""
        )
        delay = f"{h.delay:g} s" if h.delay is not None else "?"
        source = f" <small>{escape(h.delay_source)}</small>" if h.delay_source else ""
        rows.append(
            f"<tr><td class=key>{escape(h.key)}</td><td class=n>{h.ready:,}</td>"
            f"<td class=n>{h.in_flight:,}</td><td class=n>{delay}{source}</td>"
            f"<td class=n>{'?' if h.concurrency is None else f'{h.concurrency:,}'}</td>"
            f"<td>{blocked}</td>"
            f"<td class=why>{escape(h.why) if h.why is not None else 'open'}</td></tr>"
        )
    note = (
        ""
        if panel.complete
        else "<p class=note>A bounded sample: the keys that open first and those in "
        "flight (docs/politeness.md).</p>"
    )
    return (
        head + "<table id=hosts><thead><tr><th>key</th><th>ready</th><th>in flight</th>"
        "<th>delay</th><th>concurrency</th><th>blocked until (UTC)</th>"
        "<th>why not served now</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>{note}"
    )


def _per_s(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _rates_note() -> str:
    return (
        "<p class=note>Rates now: this API process's view of the last minute. Last "
        "hour: one sample per minute kept in Redis, taken while a dashboard page is "
        "read (gaps while nobody looks).</p>"
    )


def _per_minute(series: Series, field: str) -> list[tuple[int, float]]:
    """(minute, change per minute since the previous sample); a counter that went down
    (the crawl was purged) starts over."""
    at = 1 if field == "done" else 2
    out = []
    for prev, cur in itertools.pairwise(series):
        gap = cur[0] - prev[0]
        delta = cur[at] - prev[at]
        if gap > 0 and delta >= 0:
            out.append((cur[0], delta / gap))
    return out


def _spark(series: Series, field: str, now: float, width: int = 180, height: int = 28) -> str:
    """An inline SVG line of the per-minute rate over the last hour."""
    points = _per_minute(series, field)
    if not points:
        return "<span class=note>collecting (one sample a minute)</span>"
    start = int(now // 60) - HISTORY_MINUTES
    top = max(v for _, v in points) or 1.0
    xy = " ".join(
        f"{(t - start) * width / HISTORY_MINUTES:.1f},{height - 2 - v / top * (height - 4):.1f}"
        for t, v in points
    )
    last = points[-1][1]
    return (
        f'<svg class=spark width={width} height={height} viewBox="0 0 {width} '
        f'{height}" role=img aria-label="{field} per minute"><title>{field} per '
        f"minute over the last hour: last {last:,.0f}, peak {top:,.0f}</title>"
        f'<polyline fill=none stroke="#36c" stroke-width=1.5 points="{xy}"/>'
        f"</svg> {last:,.0f}/min"
    )
