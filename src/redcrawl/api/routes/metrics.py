"""``GET /metrics``: the Prometheus text format, read from Redis at scrape time
(:mod:`redcrawl.metrics`). Access: a read (or admin) token as ``Authorization: Bearer``,
like every read endpoint (Prometheus: ``authorization: {credentials: <token>}`` in the
scrape config); open when no token is configured (``serve`` then binds loopback only).
Each scrape also records the minute's sample of the dashboard's history
(:mod:`redcrawl.metrics.history`)."""

from __future__ import annotations

import threading

from fastapi import APIRouter, Response

from redcrawl.api.context import Context
from redcrawl.api.errors import StateErrors, responses


def router(ctx: Context) -> APIRouter:
    """The route, bound to the app's :class:`Context`."""
    from redcrawl.metrics.collector import CONTENT_TYPE, render
    from redcrawl.metrics.history import record_history
    from redcrawl.metrics.snapshot import Snapshot, SnapshotReader

    r = APIRouter(route_class=StateErrors)
    readers: list[SnapshotReader] = []
    lock = threading.Lock()

    @r.get(
        "/metrics",
        tags=["metrics"],
        dependencies=ctx.read,
        summary="Prometheus metrics of every crawl (docs/metrics.md)",
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}}, **responses(401)},
    )
    def metrics() -> Response:
        with lock:
            if not readers:  # the client is set at startup
                readers.append(SnapshotReader(ctx.client(), ctx.settings))
        reader = readers[0]

        def history(snap: Snapshot) -> None:  # the dashboard's last hour, kept while scraped
            record_history(reader.client, ctx.settings, snap.crawls, snap.now, read=False)

        return Response(render(reader, history), media_type=CONTENT_TYPE)

    return r
