"""Requests: submit (deduplicated like the scheduler), describe one, requeue dead ones."""

from __future__ import annotations

from typing import Annotated

import scrapy
from fastapi import APIRouter, HTTPException, Path

from redcrawl import codec
from redcrawl.api import models as m
from redcrawl.api.bodies import RawBody, body_doc, parse
from redcrawl.api.context import Context, Crawl
from redcrawl.api.errors import Invalid, StateErrors, responses
from redcrawl.codec import Envelope
from redcrawl.errors import EncodeError
from redcrawl.fingerprint import request_fingerprint


def router(ctx: Context) -> APIRouter:
    """The routes, bound to the app's :class:`Context`."""
    r = APIRouter(route_class=StateErrors)

    def envelope(i: int, item: m.RequestIn) -> Envelope:
        where = f"requests[{i}]"
        try:
            body = item.body_bytes()
        except ValueError as exc:
            raise Invalid(f"{where}.body", str(exc)) from None
        try:
            request = scrapy.Request(
                item.url,
                method=item.method.upper(),
                headers=item.header_pairs(),
                body=body,
                priority=item.priority,
                dont_filter=item.dont_filter,
                meta=item.meta,
            )
            fp = (
                None
                if item.dont_filter
                else request_fingerprint(
                    request,
                    canonicalizer=ctx.canonicalizer,
                    version_meta_key=ctx.settings.fingerprint_version_meta,
                )
            )
        except (ValueError, TypeError) as exc:
            raise Invalid(f"{where}.url", f"cannot build a request from it: {exc}") from None
        try:
            env = codec.from_request(request, None, fingerprint=fp)
            env.callback = item.callback
            env.dont_filter = fp is None
            codec.encode(env)  # nothing is written unless every request can be stored
        except EncodeError as exc:
            text = str(exc)
            field = "meta" if text.startswith("meta") else "url" if "URL" in text else ""
            raise Invalid(f"{where}.{field}" if field else where, text) from None
        return env

    @r.post(
        "/v1/crawls/{crawl}/requests",
        tags=["requests"],
        dependencies=ctx.admin,
        summary="Submit one request or a batch (deduplicated like the scheduler)",
        responses=responses(401, 403, 413, 422, 503),
        openapi_extra=body_doc(m.SubmitIn),
        response_model_exclude_none=True,
    )
    def submit(crawl: Crawl, raw: RawBody) -> m.SubmitOut:
        payload = parse(m.SubmitIn, raw)
        items = payload.requests
        if len(items) > ctx.settings.api_max_batch:
            raise Invalid(
                "requests",
                f"{len(items)} requests; send at most "
                f"{ctx.settings.api_max_batch} per call "
                "(REDCRAWL_API_MAX_BATCH)",
            )
        envs = [envelope(i, item) for i, item in enumerate(items)]
        groups: dict[float, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(item.delay, []).append(i)
        flags: list[bool] = [False] * len(items)
        f = ctx.frontier(crawl)
        for delay, idx in groups.items():
            result = f.push([envs[i] for i in idx], delay=delay, recrawl=payload.recrawl)
            for i, flag in zip(idx, result.flags, strict=True):
                flags[i] = flag
        accepted = sum(flags)
        out = [
            m.SubmitItem(accepted=flag, id=env.fingerprint.hex() if env.fingerprint else None)
            for flag, env in zip(flags, envs, strict=True)
        ]
        return m.SubmitOut(
            crawl=crawl, accepted=accepted, filtered=len(flags) - accepted, items=out
        )

    @r.get(
        "/v1/crawls/{crawl}/requests/{request_id}",
        tags=["requests"],
        dependencies=ctx.read,
        summary="Where one stored request is (404 if unknown or done)",
        responses=responses(401, 404, 422, 503),
    )
    def describe(
        crawl: Crawl,
        request_id: Annotated[
            str,
            Path(
                pattern=m.REQUEST_ID_PATTERN,
                description="40 hex digits or #<seq> (as %23<seq> in the URL).",
            ),
        ],
    ) -> m.RequestDetail:
        info = ctx.existing(crawl).describe(request_id)
        if info is None:
            raise HTTPException(
                404,
                f"request {request_id} is not stored in crawl {crawl!r}: "
                "it is unknown, or done (done requests are only "
                "remembered by their fingerprint)",
            )
        return m.RequestDetail.of(crawl, info)

    @r.post(
        "/v1/crawls/{crawl}/dead/requeue",
        tags=["requests"],
        dependencies=ctx.admin,
        summary="Dead letters back to ready with a fresh attempt budget",
        responses=responses(401, 403, 404, 413, 422, 503),
        openapi_extra=body_doc(m.RequeueIn, required=False),
    )
    def requeue(crawl: Crawl, raw: RawBody) -> m.RequeuedOut:
        payload = parse(m.RequeueIn, raw) if raw.strip() else m.RequeueIn()
        f = ctx.existing(crawl)
        n = f.requeue_dead(payload.ids, limit=payload.limit)
        return m.RequeuedOut(crawl=crawl, requeued=n)

    return r
