"""Workers: their heartbeats; give a stuck worker's leases back."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from redcrawl.api import models as m
from redcrawl.api.context import Context, Crawl
from redcrawl.api.errors import StateErrors, responses


def router(ctx: Context) -> APIRouter:
    """The routes, bound to the app's :class:`Context`."""
    r = APIRouter(route_class=StateErrors)

    @r.get(
        "/v1/crawls/{crawl}/workers",
        tags=["workers"],
        dependencies=ctx.read,
        summary="Workers that heartbeat into the crawl",
        responses=responses(401, 404, 422, 503),
    )
    def workers(crawl: Crawl) -> m.WorkerList:
        beats = ctx.existing(crawl).workers()
        now = ctx.server_time()
        return m.WorkerList(
            crawl=crawl,
            server_time=now,
            workers=[
                m.WorkerItem(worker=w, heartbeat_deadline=d, alive=d > now)
                for w, d in sorted(beats.items())
            ],
        )

    @r.post(
        "/v1/crawls/{crawl}/workers/{worker}/reclaim",
        tags=["workers"],
        dependencies=ctx.admin,
        summary="Give a worker's leased requests back to the queue",
        responses=responses(401, 403, 404, 422, 503),
    )
    def reclaim(
        crawl: Crawl, worker: Annotated[str, Path(min_length=1, max_length=512)]
    ) -> m.ReclaimedOut:
        n = ctx.existing(crawl).release_worker(worker)
        return m.ReclaimedOut(crawl=crawl, worker=worker, reclaimed=n)

    return r
