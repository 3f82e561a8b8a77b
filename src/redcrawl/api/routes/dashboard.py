"""The web dashboard: ``/`` (every crawl) and ``/crawls/{crawl}`` (one crawl), rendered on
the server as plain HTML (no JavaScript, no asset fetched from anywhere; a meta refresh
reloads the page).

Access is the API's: a read token to look, an admin token to act. A browser cannot send a
bearer header on a page load, so ``/login`` takes the token in a form and keeps it in a
cookie (``HttpOnly``, ``SameSite=Strict``, ``Secure`` behind https) that is checked
exactly like the header (which pages accept too). Buttons (requeue, pause, resume) POST
forms carrying a CSRF token: an HMAC of the session (the token, or a random cookie when
the API is open) under a key derived from the configured tokens, so every API process
behind a balancer accepts it. The Host/Origin guard (:mod:`redcrawl.api.hosts`) runs
before all of this, as for the API. Every text that comes from Redis (crawl names,
URLs, errors, worker ids) is escaped; the pages also send a Content-Security-Policy that
allows no script at all.

Rates: "now" is the change over the last minute as this API process saw it
(:class:`~redcrawl.api.rates.RateBook`); "last hour" is a series of one sample per minute
kept in Redis (:attr:`~redcrawl.keys.CrawlKeys.history`, at most 60 entries per crawl)
and written when a dashboard page is read or ``/metrics`` is scraped
(:mod:`redcrawl.metrics.history`), so it has gaps only while neither happens.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from html import escape
from typing import Any, Literal
from urllib.parse import parse_qs, quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from redcrawl.api.auth import _matches, open_access
from redcrawl.api.context import Context
from redcrawl.api.errors import StateErrors
from redcrawl.api.inputs import REQUEST_ID_PATTERN
from redcrawl.frontier import Counts
from redcrawl.keys import CRAWL_NAME_PATTERN, HISTORY_MINUTES
from redcrawl.metrics.history import Series, record_history
from redcrawl.metrics.hosts_view import HostsPanel, read_hosts
from redcrawl.metrics.snapshot import CrawlSnapshot, SnapshotReader
from redcrawl.politeness.hosts import Sort

__all__ = ["COOKIE", "REFRESH", "router"]

COOKIE = "redcrawl_token"
"""The cookie holding the token given at ``/login``."""
SESSION = "redcrawl_session"
"""Without tokens: a random cookie the CSRF token is tied to."""
REFRESH = 10
"""Seconds between reloads of a page (``?refresh=N`` changes it, 0 stops it)."""
DEAD_ROWS = 50
"""Dead letters listed on a crawl's page (oldest first)."""
HOSTS_ROWS = 20
"""Politeness keys listed on a crawl's page (``?hosts=ready|inflight``: the order)."""
MAX_FORM = 4096
"""Largest form body a dashboard POST reads."""
_CRAWL_NAME = re.compile(CRAWL_NAME_PATTERN)
_REQUEST_ID = re.compile(REQUEST_ID_PATTERN)
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)

Level = Literal["read", "admin"]


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who asks: ``level`` None when not allowed in; ``session`` what the CSRF token is
    tied to; ``new_session`` a random session cookie to set (open API, first visit)."""

    level: Level | None
    session: str
    new_session: str = ""


def router(ctx: Context) -> APIRouter:  # noqa: C901 (one nested route per page and action)
    """The pages, bound to the app's :class:`Context`."""
    r = APIRouter(route_class=StateErrors, include_in_schema=False)
    settings = ctx.settings
    is_open = open_access(settings)
    if is_open:
        csrf_key = secrets.token_bytes(32)  # loopback only, one process
    else:
        material = "\0".join(sorted(settings.api_admin_tokens + settings.api_tokens))
        csrf_key = hashlib.sha256(b"redcrawl dashboard csrf\0" + material.encode()).digest()
    readers: list[SnapshotReader] = []

    def level_of(token: str) -> Level | None:
        if _matches(token, settings.api_admin_tokens):
            return "admin"
        if _matches(token, settings.api_tokens):
            return "read"
        return None

    def viewer(request: Request) -> Viewer:
        if is_open:
            session = request.cookies.get(SESSION, "")
            if len(session) < 16:
                session = secrets.token_urlsafe(24)
                return Viewer("admin", session, new_session=session)
            return Viewer("admin", session)
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if not (scheme.lower() == "bearer" and token.strip()):
            token = request.cookies.get(COOKIE, "")
        token = token.strip()
        return Viewer(level_of(token) if token else None, token)

    def csrf(v: Viewer) -> str:
        return hmac.new(csrf_key, b"csrf\0" + v.session.encode(), hashlib.sha256).hexdigest()

    def page(
        v: Viewer, title: str, body: str, *, status: int = 200, refresh: int = 0
    ) -> HTMLResponse:
        resp = HTMLResponse(
            _layout(
                title,
                body,
                refresh=refresh,
                logged_in=not is_open and v.level is not None and bool(v.session),
            ),
            status_code=status,
        )
        resp.headers["Content-Security-Policy"] = CSP
        resp.headers["Cache-Control"] = "no-store"
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Referrer-Policy"] = "same-origin"  # no-referrer makes Origin "null"
        if v.new_session:
            resp.set_cookie(SESSION, v.new_session, httponly=True, samesite="strict", path="/")
        return resp

    def to_login(request: Request) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse("/login?" + urlencode({"next": target}), status_code=303)

    def refresh_of(request: Request) -> int:
        raw = request.query_params.get("refresh", "")
        return min(int(raw), 3600) if raw.isascii() and raw.isdigit() and len(raw) < 6 else REFRESH

    def sticky(request: Request) -> str:
        """``?refresh=N`` when the page was asked with one: links and forms keep it."""
        raw = request.query_params.get("refresh", "")
        return f"?refresh={refresh_of(request)}" if raw else ""

    def reader() -> SnapshotReader:
        if not readers:  # the client is set at startup
            readers.append(SnapshotReader(ctx.client(), settings))
        return readers[0]

    # --- pages -------------------------------------------------------------------------
    @r.get("/", response_class=HTMLResponse)
    def overview(request: Request) -> Response:
        v = viewer(request)
        if v.level is None:
            return to_login(request)
        snap = reader().read()
        crawls = [
            c
            for c, ok in zip(snap.crawls, ctx.alive([c.crawl for c in snap.crawls]), strict=True)
            if ok
        ]
        hist = _history(ctx.client(), settings, crawls, snap.now)
        rows = []
        keep = sticky(request)
        for c in crawls:
            n = c.counts
            rate = ctx.rates.observe(c.crawl, n.done, n.accepted)
            rows.append(
                "<tr>"
                f'<td><a href="/crawls/{quote(c.crawl, safe="")}{keep}">{escape(c.crawl)}</a></td>'
                f"<td>{escape(_state(c))}</td>"
                + "".join(
                    f"<td class=n>{x:,}</td>"
                    for x in (n.ready, n.delayed, n.in_flight, n.done, n.dead)
                )
                + f"<td class=n>{c.workers_alive:,}</td>"
                f"<td class=n>{_per_s(rate.done_per_s)}</td>"
                f"<td>{_spark(hist[c.crawl], 'done', snap.now)}</td>"
                "</tr>"
            )
        more = (
            f"<p class=note>{snap.crawls_left_out:,} more crawls not shown.</p>"
            if snap.crawls_left_out
            else ""
        )
        table = (
            "<table id=crawls><thead><tr><th>crawl</th><th>state</th><th>ready</th>"
            "<th>delayed</th><th>in flight</th><th>done</th><th>dead</th>"
            "<th>workers</th><th>done/s</th><th>done/min, last hour</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>"
            if rows
            else "<p id=empty>No crawl yet: submit requests or start workers.</p>"
        )
        return page(
            v,
            "redcrawl",
            f"<h1>Crawls</h1>{table}{more}{_rates_note()}",
            refresh=refresh_of(request),
        )

    @r.get("/crawls/{crawl}", response_class=HTMLResponse)
    def crawl_page(request: Request, crawl: str) -> Response:
        v = viewer(request)
        if v.level is None:
            return to_login(request)
        if not _CRAWL_NAME.match(crawl) or not ctx.alive([crawl])[0]:
            return page(
                v,
                "not found",
                f"<h1>No crawl {escape(crawl)!s}</h1><p>It does not "
                "exist (no request was submitted to it since it was created or "
                'purged). <a href="/">All crawls</a></p>',
                status=404,
            )
        snap = SnapshotReader(ctx.client(), settings, crawls=[crawl]).read()
        c = snap.crawls[0]
        n = c.counts
        rate = ctx.rates.observe(crawl, n.done, n.accepted)
        hist = _history(ctx.client(), settings, [c], snap.now)[crawl]
        f = ctx.frontier(crawl)
        dead = f.dead(DEAD_ROWS)
        admin = v.level == "admin"
        token = csrf(v) if admin else ""
        path = f"/crawls/{quote(crawl, safe='')}"
        keep = sticky(request)
        msg = request.query_params.get("done", "")
        body = [
            f'<p><a href="/{keep}">&larr; all crawls</a></p>'
            f"<h1>{escape(crawl)} <small id=state>{escape(_state(c))}</small></h1>"
        ]
        if msg:
            body.append(f"<p class=flash id=flash>{escape(msg[:200])}</p>")
        body.append(_counts_table(n, c.stats))
        body.append(
            "<table id=rates><tr><th></th><th>now (per s, last minute)</th>"
            "<th>last hour (per minute)</th></tr>"
            f"<tr><th>done</th><td class=n>{_per_s(rate.done_per_s)}</td>"
            f"<td>{_spark(hist, 'done', snap.now)}</td></tr>"
            f"<tr><th>accepted</th><td class=n>{_per_s(rate.accepted_per_s)}</td>"
            f"<td>{_spark(hist, 'accepted', snap.now)}</td></tr></table>"
        )
        if admin:
            action = "resume" if c.paused else "pause"
            body.append(_form(f"{path}/{action}{keep}", token, action, f"btn-{action}"))
        sort: Sort = "inflight" if request.query_params.get("hosts") == "inflight" else "ready"
        hosts = read_hosts(f, limit=HOSTS_ROWS, sort=sort)
        if hosts is not None:
            body.append(_hosts_table(hosts, c.open_keys, path, request.query_params))
        body.append(f"<h2>Workers ({c.workers_alive:,} alive of {c.workers_known:,} known)</h2>")
        if c.workers:
            body.append(
                "<table id=workers><thead><tr><th>worker</th><th>heartbeat age"
                "</th><th>alive</th></tr></thead><tbody>"
                + "".join(
                    f"<tr><td>{escape(w.worker)}</td><td class=n>{w.age:,.1f} s</td>"
                    f"<td>{'yes' if w.alive else 'no'}</td></tr>"
                    for w in c.workers
                )
                + "</tbody></table>"
            )
        else:
            body.append("<p>No worker heartbeat.</p>")
        body.append(f"<h2>Dead letters ({n.dead:,})</h2>")
        if dead:
            rows = []
            for d in dead:
                button = (
                    _form(f"{path}/requeue{keep}", token, "requeue", "", {"id": d.id})
                    if admin
                    else ""
                )
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(d.died_at))
                rows.append(
                    f"<tr><td><code>{escape(d.id[:16])}</code></td>"
                    f"<td class=url>{escape(d.url)}</td><td class=n>{d.attempts}</td>"
                    f"<td>{when}</td><td class=err>{escape(d.error)}</td>"
                    f"<td>{button}</td></tr>"
                )
            body.append(
                "<table id=dead><thead><tr><th>id</th><th>url</th><th>attempts</th>"
                "<th>died (UTC)</th><th>last error</th><th></th></tr></thead>"
                f"<tbody>{''.join(rows)}</tbody></table>"
            )
            if n.dead > len(dead):
                body.append(f"<p class=note>the {len(dead)} oldest shown.</p>")
            if admin:
                body.append(
                    _form(
                        f"{path}/requeue{keep}", token, f"requeue all {n.dead:,}", "btn-requeue-all"
                    )
                )
        else:
            body.append("<p>None.</p>")
        if not admin:
            body.append(
                "<p class=note>Read-only: log in with an admin token to requeue, "
                "pause or resume.</p>"
            )
        body.append(_rates_note())
        return page(v, f"{crawl} - redcrawl", "".join(body), refresh=refresh_of(request))

    # --- actions -----------------------------------------------------------------------
    async def act(request: Request, crawl: str, what: str) -> Response:
        v = viewer(request)
        if v.level != "admin":
            return page(
                v,
                "forbidden",
                "<h1>Forbidden</h1><p>"
                + (
                    "This token is read-only; requeue, pause and resume need an admin token "
                    '(REDCRAWL_API_ADMIN_TOKENS). <a href="/login">Log in</a>'
                    if v.level == "read"
                    else 'Log in first: <a href="/login">/login</a>'
                )
                + "</p>",
                status=403 if v.level == "read" else 401,
            )
        raw = await request.body()
        if len(raw) > MAX_FORM:
            return page(v, "too large", "<h1>Form too large</h1>", status=413)
        form = _form_fields(raw)
        if not hmac.compare_digest(form.get("csrf", ""), csrf(v)):
            return page(
                v,
                "expired form",
                "<h1>Form expired</h1><p>The form's CSRF token "
                "does not match your session: reload the page and try again.</p>",
                status=403,
            )
        if not _CRAWL_NAME.match(crawl):
            return page(v, "not found", "<h1>No such crawl</h1>", status=404)
        if form.get("id") and not _REQUEST_ID.match(form["id"]):
            return page(
                v,
                "invalid",
                "<h1>Invalid request id</h1><p>Give 40 hex digits or "
                "#&lt;seq&gt;, as listed on the crawl's page.</p>",
                status=422,
            )

        def run() -> str:
            f = ctx.existing(crawl)
            if what == "pause":
                f.pause()
                return "paused"
            if what == "resume":
                f.resume()
                return "resumed"
            ids = [form["id"]] if form.get("id") else None
            return f"requeued {f.requeue_dead(ids):,}"

        done = await run_in_threadpool(run)
        back = {"done": done}
        if request.query_params.get("refresh"):
            back["refresh"] = str(refresh_of(request))
        return RedirectResponse(
            f"/crawls/{quote(crawl, safe='')}?" + urlencode(back), status_code=303
        )

    @r.post("/crawls/{crawl}/requeue")
    async def requeue(request: Request, crawl: str) -> Response:
        return await act(request, crawl, "requeue")

    @r.post("/crawls/{crawl}/pause")
    async def pause(request: Request, crawl: str) -> Response:
        return await act(request, crawl, "pause")

    @r.post("/crawls/{crawl}/resume")
    async def resume(request: Request, crawl: str) -> Response:
        return await act(request, crawl, "resume")

    # --- login -------------------------------------------------------------------------
    def login_page(v: Viewer, target: str, error: str = "", status: int = 200) -> Response:
        err = f"<p class=flash id=error>{escape(error)}</p>" if error else ""
        return page(
            v,
            "log in - redcrawl",
            f"<h1>Log in</h1>{err}"
            '<form method=post action="/login"><label>API token '
            "<input type=password name=token id=token autocomplete=current-password"
            ' required></label><input type=hidden name=next value="'
            f'{escape(target)}"> <button type=submit id=login>Log in</button></form>'
            "<p class=note>A read token (REDCRAWL_API_TOKENS) shows the crawls; an "
            "admin token (REDCRAWL_API_ADMIN_TOKENS) also requeues, pauses and "
            "resumes. It is kept in an HttpOnly cookie of this site.</p>",
            status=status,
        )

    @r.get("/login", response_class=HTMLResponse)
    def login_form(request: Request) -> Response:
        if is_open:
            return RedirectResponse("/", status_code=303)
        return login_page(Viewer(None, ""), _local(request.query_params.get("next", "/")))

    @r.post("/login")
    async def login(request: Request) -> Response:
        raw = await request.body()
        form = _form_fields(raw[:MAX_FORM])
        target = _local(form.get("next", "/"))
        if is_open:
            return RedirectResponse(target, status_code=303)
        token = form.get("token", "").strip()
        if not token or level_of(token) is None:
            return login_page(Viewer(None, ""), target, "Unknown token.", status=401)
        resp = RedirectResponse(target, status_code=303)
        resp.set_cookie(
            COOKIE,
            token,
            httponly=True,
            samesite="strict",
            path="/",
            secure=request.url.scheme == "https",
        )
        return resp

    @r.post("/logout")
    async def logout() -> Response:
        resp = RedirectResponse("/login", status_code=303)
        resp.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return resp

    return r


# --- pieces of pages -------------------------------------------------------------------
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


def _form_fields(raw: bytes) -> dict[str, str]:
    """An urlencoded form, the first value of each field."""
    parsed = parse_qs(raw.decode("utf-8", errors="replace"), max_num_fields=20)
    return {k: vals[0] for k, vals in parsed.items() if vals}


def _local(target: str) -> str:
    """``target`` if it is a path of this site, else ``/`` (no open redirect)."""
    if (
        target.startswith("/")
        and not target.startswith("//")
        and "\\" not in target
        and all(31 < ord(ch) < 127 for ch in target)
    ):
        return target
    return "/"


def _state(c: CrawlSnapshot) -> str:
    n = c.counts
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


# --- the history of counters -------------------------------------------------------------
def _history(
    client: Any, settings: Any, crawls: list[CrawlSnapshot], now: float
) -> dict[str, Series]:
    """Record this minute's sample of each crawl and return each crawl's series."""
    return record_history(client, settings, crawls, now)


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
