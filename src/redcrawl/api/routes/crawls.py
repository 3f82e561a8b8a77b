"""Crawls: list, detail, pending, in flight, shards, dead letters; pause, resume, purge."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, HTTPException

from redcrawl.api import models as m
from redcrawl.api.context import Context, Crawl, Limit
from redcrawl.api.errors import TRANSIENT, StateErrors, Unreadable, responses, server_condition
from redcrawl.errors import FrontierError
from redcrawl.frontier import FrontierCore, StreamsFrontier
from redcrawl.frontier.partitioned import PartitionedStreams
from redcrawl.metrics.registry import all_crawls
from redcrawl.politeness.describe import politeness_summary
from redcrawl.transport import redis_errors


def router(ctx: Context) -> APIRouter:  # noqa: C901 (one nested route per endpoint of the resource)
    """The routes, bound to the app's :class:`Context`."""
    r = APIRouter(route_class=StateErrors)

    @r.get(
        "/v1/crawls",
        tags=["crawls"],
        dependencies=ctx.read,
        summary="Crawls (every crawl that ever received a request) with their counts",
        responses=responses(401, 422, 503),
    )
    def list_crawls(limit: Limit = 100) -> m.CrawlList:
        with redis_errors("listing crawls"):  # the crawl registry (SCAN only until complete)
            ordered = all_crawls(ctx.client(), ctx.settings.key_prefix)
        ordered = [n for n, ok in zip(ordered, ctx.alive(ordered), strict=True) if ok]
        out = []
        for name in ordered[:limit]:
            try:
                f = ctx.frontier(name)
                c = f.counts()
                summary = ctx.summary(name, c, f.lost_partitions())
            except TRANSIENT:
                raise
            except Exception as exc:  # one broken crawl must not hide the others
                if isinstance(exc, FrontierError) and server_condition(exc):
                    raise
                out.append(m.CrawlListItem(crawl=name, error=str(Unreadable(name, exc))))
                continue
            ctx.rates.observe(name, c.done, c.accepted)
            out.append(m.CrawlListItem(**summary))
        return m.CrawlList(crawls=out)

    @r.get(
        "/v1/crawls/{crawl}",
        tags=["crawls"],
        dependencies=ctx.read,
        summary="One crawl: counts, paused, workers alive, rates (per API process)",
        responses=responses(401, 404, 422, 503),
    )
    def crawl_detail(crawl: Crawl) -> m.CrawlDetail:
        f = ctx.existing(crawl)
        c = f.counts()
        now = ctx.server_time()
        alive = sum(1 for deadline in f.workers().values() if deadline > now)
        lost = f.lost_partitions()
        return m.CrawlDetail(
            **ctx.summary(crawl, c, lost),
            paused=f.is_paused(),
            workers_alive=alive,
            rates=ctx.rates.observe(crawl, c.done, c.accepted),
            politeness=politeness_summary(f),
            robots_disallowed=f.stats().get("robots_disallowed", 0),
            lost_partitions=lost,
        )

    @r.get(
        "/v1/crawls/{crawl}/pending",
        tags=["crawls"],
        dependencies=ctx.read,
        summary="Ready requests, next served first within each tier",
        responses=responses(401, 404, 422, 503),
    )
    def pending(crawl: Crawl, limit: Limit = 100) -> m.PendingList:
        items = ctx.existing(crawl).pending(limit)
        return m.PendingList(crawl=crawl, items=[m.PendingItem.model_validate(p) for p in items])

    @r.get(
        "/v1/crawls/{crawl}/inflight",
        tags=["crawls"],
        dependencies=ctx.read,
        summary="Leased requests: worker, since, deadline",
        responses=responses(401, 404, 422, 503),
    )
    def inflight(crawl: Crawl, limit: Limit = 100) -> m.InflightList:
        items = ctx.existing(crawl).inflight(limit)
        return m.InflightList(crawl=crawl, items=[m.InflightItem.model_validate(x) for x in items])

    @r.get(
        "/v1/crawls/{crawl}/shards",
        tags=["crawls"],
        dependencies=ctx.read,
        summary="Streams backend: per shard and stream, length, pending entries with "
        "their consumer, idle time and delivery count",
        responses=responses(401, 404, 409, 422, 503),
    )
    def shards(crawl: Crawl, limit: Limit = 100) -> m.ShardList:
        f = ctx.existing(crawl)
        if not isinstance(f, StreamsFrontier | PartitionedStreams):
            raise HTTPException(
                409,
                f"crawl {crawl!r} uses the lists backend; shards exist "
                "only on the streams backend (REDCRAWL_BACKEND=streams)",
            )
        return m.ShardList(
            crawl=crawl,
            shards=f.settings.shards,
            streams=[m.ShardItem.model_validate(s) for s in f.shards(limit)],
        )

    @r.get(
        "/v1/crawls/{crawl}/dead",
        tags=["crawls"],
        dependencies=ctx.read,
        summary="Dead-lettered requests with their last error, oldest first",
        responses=responses(401, 404, 422, 503),
    )
    def dead(crawl: Crawl, limit: Limit = 100) -> m.DeadList:
        items = ctx.existing(crawl).dead(limit)
        return m.DeadList(crawl=crawl, items=[m.DeadItem.model_validate(x) for x in items])

    def switch(crawl: str, action: Callable[[FrontierCore], None]) -> m.PausedOut:
        f = ctx.existing(crawl)
        action(f)
        return m.PausedOut(crawl=crawl, paused=f.is_paused())

    @r.post(
        "/v1/crawls/{crawl}/pause",
        tags=["crawls"],
        dependencies=ctx.admin,
        summary="Stop handing out requests (pushes still accepted)",
        responses=responses(401, 403, 404, 422, 503),
    )
    def pause(crawl: Crawl) -> m.PausedOut:
        return switch(crawl, lambda f: f.pause())

    @r.post(
        "/v1/crawls/{crawl}/resume",
        tags=["crawls"],
        dependencies=ctx.admin,
        summary="Hand out requests again",
        responses=responses(401, 403, 404, 422, 503),
    )
    def resume(crawl: Crawl) -> m.PausedOut:
        return switch(crawl, lambda f: f.resume())

    @r.delete(
        "/v1/crawls/{crawl}",
        tags=["crawls"],
        dependencies=ctx.admin,
        summary="Purge the crawl's frontier: queues, leases, dead letters, dedupe",
        responses=responses(401, 403, 404, 422, 503),
    )
    def purge(crawl: Crawl) -> m.PurgedOut:
        ctx.existing(crawl).purge()
        ctx.frontiers.clear()  # re-created later, maybe with another layout
        return m.PurgedOut(crawl=crawl, purged=True)

    return r
