"""Politeness keys (hosts) of a crawl: list, one key with why it is not served now, the
operator's override (set, drop). A thin layer over :class:`redcrawl.politeness.hosts.Hosts`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Query

from redcrawl.api import models as m
from redcrawl.api.bodies import RawBody, body_doc, parse
from redcrawl.api.context import Context, Crawl, Limit
from redcrawl.api.errors import Invalid, StateErrors, responses
from redcrawl.politeness.hosts import (
    UNSET,
    BadHostInput,
    HostDetail,
    Hosts,
    PolitenessOff,
    check_key,
)

Key = Annotated[
    str,
    Path(
        min_length=1,
        max_length=255,
        description="Politeness key: a host name (example.com), a registrable domain, or "
        "a download_slot, as GET .../hosts lists it.",
    ),
]


def router(ctx: Context) -> APIRouter:
    """The routes, bound to the app's :class:`Context`."""
    r = APIRouter(route_class=StateErrors)

    def hosts(crawl: str) -> Hosts:
        f = ctx.existing(crawl)
        try:
            return Hosts(f)
        except PolitenessOff as exc:
            raise HTTPException(409, str(exc)) from None

    def key_of(key: str) -> str:
        try:
            return check_key(key)
        except BadHostInput as exc:
            # (over 255 bytes, control characters: such a key cannot exist)
            raise HTTPException(404, f"no such politeness key: {exc.problem}") from None

    def out(d: HostDetail) -> m.HostOut:
        return m.HostOut.model_validate(d)

    @r.get(
        "/v1/crawls/{crawl}/hosts",
        tags=["hosts"],
        dependencies=ctx.read,
        summary="Politeness keys with ready work or in flight, most ready (or in flight) "
        "first; bounded per call (see complete)",
        responses=responses(401, 404, 409, 422, 503),
    )
    def list_hosts(
        crawl: Crawl,
        limit: Limit = 100,
        sort: Annotated[
            Literal["ready", "inflight"], Query(description="Most ready, or most in flight.")
        ] = "ready",
        cursor: Annotated[
            str | None,
            Query(pattern=r"^[0-9]{1,9}$", description="next_cursor of the previous page."),
        ] = None,
    ) -> m.HostList:
        page = hosts(crawl).top(limit=limit, sort=sort, cursor=cursor)
        return m.HostList.model_validate(page)

    @r.get(
        "/v1/crawls/{crawl}/hosts/{key}",
        tags=["hosts"],
        dependencies=ctx.read,
        summary="One politeness key: ready, in flight, limits and where they come from, "
        "blocks, robots.txt, and why it is not served right now",
        responses=responses(401, 404, 409, 422, 503),
    )
    def show_host(crawl: Crawl, key: Key) -> m.HostOut:
        h = hosts(crawl)
        return out(h.show(key_of(key)))

    @r.put(
        "/v1/crawls/{crawl}/hosts/{key}",
        tags=["hosts"],
        dependencies=ctx.admin,
        summary="Override a key's delay, concurrency, block or pause (merged; null removes "
        "a field); the next lease obeys it",
        responses=responses(401, 403, 404, 409, 413, 422, 503),
        openapi_extra=body_doc(m.HostOverrideIn),
    )
    def set_host(crawl: Crawl, key: Key, raw: RawBody) -> m.HostOut:
        payload = parse(m.HostOverrideIn, raw)
        h = hosts(crawl)
        given = payload.model_fields_set
        changes: dict[str, Any] = {
            name: getattr(payload, name) if name in given else UNSET
            for name in ("delay", "concurrency", "block_until", "paused")
        }
        if "block_for" in given and "block_until" in given:
            raise Invalid("block_for", "give block_until or block_for, not both")
        if payload.block_for is not None:
            changes["block_for"] = payload.block_for
        try:
            return out(h.set(key_of(key), **changes))
        except BadHostInput as exc:
            raise Invalid(exc.field, exc.problem) from None

    @r.delete(
        "/v1/crawls/{crawl}/hosts/{key}",
        tags=["hosts"],
        dependencies=ctx.admin,
        summary="Drop the operator's override of a key (robots.txt's Crawl-delay and "
        "AutoThrottle's delay stay)",
        responses=responses(401, 403, 404, 409, 422, 503),
    )
    def reset_host(crawl: Crawl, key: Key) -> m.HostOut:
        h = hosts(crawl)
        return out(h.reset(key_of(key)))

    return r
