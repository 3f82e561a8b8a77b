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
allows no script at all. Who may do what, and the response a page is sent in, is
:mod:`redcrawl.api.dashboard_access`; the HTML pieces :mod:`redcrawl.api.dashboard_html`.

Rates: "now" is the change over the last minute as this API process saw it
(:class:`~redcrawl.api.rates.RateBook`); "last hour" is a series of one sample per minute
kept in Redis (:attr:`~redcrawl.keys.CrawlKeys.history`, at most 60 entries per crawl)
and written when a dashboard page is read or ``/metrics`` is scraped
(:mod:`redcrawl.metrics.history`), so it has gaps only while neither happens.
"""

from __future__ import annotations

import hmac
import re
import time
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from redcrawl.api.context import Context
from redcrawl.api.dashboard_access import (
    COOKIE,
    MAX_FORM,
    Access,
    Viewer,
    _form_fields,
    _local,
)
from redcrawl.api.dashboard_html import _counts_table as _counts_table  # (tests import it here)
from redcrawl.api.dashboard_html import (
    _form,
    _hosts_table,
    _per_s,
    _rates_note,
    _spark,
    _state,
)
from redcrawl.api.errors import StateErrors
from redcrawl.api.inputs import REQUEST_ID_PATTERN
from redcrawl.keys import CRAWL_NAME_PATTERN
from redcrawl.metrics.history import Series, record_history
from redcrawl.metrics.hosts_view import read_hosts
from redcrawl.metrics.snapshot import CrawlSnapshot, SnapshotReader
from redcrawl.politeness.hosts import Sort

__all__ = ["COOKIE", "REFRESH", "router"]

REFRESH = 10
"""Seconds between reloads of a page (``?refresh=N`` changes it, 0 stops it)."""
DEAD_ROWS = 50
"""Dead letters listed on a crawl's page (oldest first)."""
HOSTS_ROWS = 20
"""Politeness keys listed on a crawl's page (``?hosts=ready|inflight``: the order)."""
REQUEUE_STEP = 1000
"""Dead letters requeued per atomic step by "requeue all N"."""
REQUEUE_ALL_STEPS = 10_000
"""At most this many steps per "requeue all" (10 million letters)."""
_CRAWL_NAME = re.compile(CRAWL_NAME_PATTERN)
_FLASH = re.compile(r"paused|resumed|requeued [0-9][0-9,]*")
"""The banner messages the actions redirect with (``?done=``); any other is not shown."""
_REQUEST_ID = re.compile(REQUEST_ID_PATTERN)


def router(ctx: Context) -> APIRouter:  # noqa: C901 (one nested route per page and action)
    """The pages, bound to the app's :class:`Context`."""
    r = APIRouter(route_class=StateErrors, include_in_schema=False)
    settings = ctx.settings
    access = Access(settings)
    page, viewer, to_login = access.page, access.viewer, access.to_login
    readers: list[SnapshotReader] = []

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
        if not _CRAWL_NAME.fullmatch(crawl) or not ctx.alive([crawl])[0]:
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
        token = access.csrf(v) if admin else ""
        path = f"/crawls/{quote(crawl, safe='')}"
        keep = sticky(request)
        msg = request.query_params.get("done", "")
        if not _FLASH.fullmatch(msg):  # (only what the actions say: no link's own words)
            msg = ""
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
        raw = await _form_body(request)
        if raw is None:
            return page(v, "too large", "<h1>Form too large</h1>", status=413)
        form = _form_fields(raw)
        if not hmac.compare_digest(form.get("csrf", ""), access.csrf(v)):
            return page(
                v,
                "expired form",
                "<h1>Form expired</h1><p>The form's CSRF token "
                "does not match your session: reload the page and try again.</p>",
                status=403,
            )
        if not _CRAWL_NAME.fullmatch(crawl):
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
            if form.get("id"):
                return f"requeued {f.requeue_dead([form['id']]):,}"
            # "requeue all N": every dead letter, 1,000 per atomic step (each step is
            # short; a letter that dies again meanwhile may be requeued again)
            total = 0
            for _ in range(REQUEUE_ALL_STEPS):
                n = f.requeue_dead(None, limit=REQUEUE_STEP)
                total += n
                if n < REQUEUE_STEP:
                    break
            return f"requeued {total:,}"

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
        if access.is_open:
            return RedirectResponse("/", status_code=303)
        return login_page(Viewer(None, ""), _local(request.query_params.get("next", "/")))

    @r.post("/login")
    async def login(request: Request) -> Response:
        # (no token yet: a login form is never over MAX_FORM, so no more of an anonymous
        # body is read, whatever its declared length)
        raw = await _form_body(request)
        if raw is None:
            return page(Viewer(None, ""), "too large", "<h1>Form too large</h1>", status=413)
        form = _form_fields(raw)
        target = _local(form.get("next", "/"))
        if access.is_open:
            return RedirectResponse(target, status_code=303)
        token = form.get("token", "").strip()
        if not token or access.level_of(token) is None:
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


# --- the history of counters -------------------------------------------------------------
def _history(
    client: Any, settings: Any, crawls: list[CrawlSnapshot], now: float
) -> dict[str, Series]:
    """Record this minute's sample of each crawl and return each crawl's series."""
    return record_history(client, settings, crawls, now)


async def _form_body(request: Request) -> bytes | None:
    """The form's body, or None once it is over MAX_FORM (declared or read so far): the
    rest is never read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_FORM:
        return None
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_FORM:
            return None
    return raw
